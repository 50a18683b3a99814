//! The tiny tokenizer: reproducible from the shipped corpus, trace tags are single tokens, control
//! tokens are dropped from text and tags are kept.

mod common;

use toolsmith_policy::TINY_TOKENIZER;
use toolsmith_policy::tokenizer::{END_OF_TEXT, IM_END, IM_START, TRACE_TAGS, Tokenizer, train_tiny};

fn tiny() -> Tokenizer {
    Tokenizer::tiny().expect("tiny tokenizer")
}

#[test]
fn the_shipped_tokenizer_is_what_the_shipped_corpus_trains() {
    let corpus =
        std::fs::read_to_string(common::repo_root().join("host/policy/assets/tokenizer-corpus.txt")).expect("corpus");
    let paragraphs: Vec<String> = corpus.split("\n\n").filter(|p| !p.trim().is_empty()).map(str::to_owned).collect();
    let trained = train_tiny(&paragraphs, 4096).expect("train");
    let shipped: serde_json::Value = serde_json::from_str(TINY_TOKENIZER).expect("json");
    let retrained: serde_json::Value =
        serde_json::from_str(&trained.to_string(false).expect("serialise")).expect("json");
    assert_eq!(retrained, shipped, "retrain with `toolsmith policy train-tokenizer` after changing the corpus");
}

#[test]
fn trace_tags_are_single_tokens_and_survive_decoding() {
    let tok = tiny();
    for tag in TRACE_TAGS {
        let ids = tok.encode(tag).expect("encode");
        assert_eq!(ids.len(), 1, "{tag} is {ids:?}");
        assert_eq!(Some(ids[0]), tok.token_id(tag));
    }
    let text = "<plan>\nTask 1: find it - Dependencies: none\n</plan><tool_call>{\"name\": \"search\"}</tool_call>";
    let ids = tok.encode(text).expect("encode");
    assert_eq!(tok.decode(&ids).expect("decode"), text, "byte-level BPE round-trips text with tags");
    let plan = tok.token_id("<plan>").expect("tag");
    assert_eq!(ids[0], plan);
    // A tag inside a word is still one token.
    assert!(tok.encode("x<mem>y").expect("encode").contains(&tok.token_id("<mem>").expect("tag")));
}

#[test]
fn control_tokens_end_turns_and_vanish_from_text() {
    let tok = tiny();
    let (im_start, im_end, eot) = (
        tok.token_id(IM_START).expect("id"),
        tok.token_id(IM_END).expect("id"),
        tok.token_id(END_OF_TEXT).expect("id"),
    );
    assert_eq!(tok.eos_ids(), [im_end, eot]);
    assert_eq!(tok.pad_id(), eot);
    let ids = tok.encode("<|im_start|>user\nhi<|im_end|>").expect("encode");
    assert_eq!((ids[0], *ids.last().expect("ids")), (im_start, im_end));
    assert_eq!(tok.decode(&ids).expect("decode"), "user\nhi");
    assert!(tok.chat_template().is_some_and(|t| t.contains("im_start")));
    assert!(tok.decode(&[-3]).is_err());
    assert!(Tokenizer::from_bytes(b"{\"not\": \"a tokenizer\"}", None).is_err());
}

#[test]
fn unicode_round_trips() {
    let tok = tiny();
    for text in ["naïve café ☕ — 東京 🦀", "x² + y² = z²", "\t\n  spaces  \n"] {
        let ids = tok.encode(text).expect("encode");
        assert_eq!(tok.decode(&ids).expect("decode"), text);
    }
}
