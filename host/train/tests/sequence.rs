//! Token-exact sequences: masks decoded back to text hold exactly the assistant's turns; the
//! builder's ids are the template's rendering tokenized; ids turns are spliced untouched; bad
//! conversations are refused with the file and line.

use std::sync::Arc;

use toolsmith_agent::backend::{ChatTemplate, Message, Role};
use toolsmith_agent::env::{Corpus, World, WorldConfig};
use toolsmith_agent::oracle::{Oracle, synthesize};
use toolsmith_agent::tools::LocalTools;
use toolsmith_agent::{Mode, ToolFormat};
use toolsmith_policy::Tokenizer;
use toolsmith_train::conversation::{Chat, Content, read_chats};
use toolsmith_train::sequence::{SequenceBuilder, SequenceError};

/// Oracle traces of a small world in the react, gap and mem styles (MemPO: one chat per turn).
fn traces() -> Vec<Vec<Message>> {
    let world = World::generate(WorldConfig { seed: 3, countries: 2, tasks_per_family: 2 });
    let tasks = world.tasks();
    let tools = Arc::new(LocalTools::new().with_corpus(Arc::new(Corpus::new(&world.documents()).expect("corpus"))));
    let tokenizer = Arc::new(Tokenizer::tiny().expect("tokenizer"));
    let oracle = Oracle::new(&tasks, Mode::Gap, tokenizer);
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    let examples = runtime.block_on(synthesize(
        &oracle,
        tools,
        &tasks,
        &[Mode::React, Mode::Gap, Mode::Mem],
        ToolFormat::Compact,
        || {},
    ));
    examples.into_iter().filter(|e| e.correct).map(|e| e.messages).collect()
}

#[test]
fn masked_spans_decode_to_exactly_the_assistant_turns() {
    let tokenizer = Tokenizer::tiny().expect("tokenizer");
    let builder = SequenceBuilder::new(&tokenizer, 4096).expect("builder");
    let template = ChatTemplate::of(&tokenizer).expect("template");
    let im_end = tokenizer.token_id("<|im_end|>").expect("im_end");
    let chats = traces();
    assert!(chats.len() > 20, "{} traces", chats.len());
    let (mut trained, mut total) = (0, 0);
    for messages in &chats {
        let seq = builder.build(&Chat::from_messages(messages)).expect("builds");
        // The rendered conversation tokenized in one piece, token for token.
        let rendered = template.render(messages, false).expect("renders");
        assert_eq!(seq.tokens.ids, tokenizer.encode(&rendered).expect("encodes"));
        // Each trained span is one assistant turn followed by its end-of-turn token, in order.
        let assistant: Vec<&str> =
            messages.iter().filter(|m| m.role == Role::Assistant).map(|m| m.content.as_str()).collect();
        let spans = seq.trained_spans();
        assert_eq!(spans.len(), assistant.len());
        for (span, text) in spans.iter().zip(&assistant) {
            assert_eq!(*span.last().expect("non-empty"), im_end);
            assert_eq!(tokenizer.decode(span).expect("decodes"), *text);
        }
        assert_eq!(seq.turns.len(), assistant.len());
        // No observation, question or system token is trained on.
        for (i, &m) in seq.tokens.loss_mask.iter().enumerate() {
            if m {
                assert!(seq.turns.iter().any(|t| t.contains(&i)));
            }
        }
        trained += seq.trained_tokens();
        total += seq.len();
    }
    println!(
        "{} chats, {trained} of {total} tokens trained ({:.1}%)",
        chats.len(),
        100.0 * trained as f64 / total as f64
    );
}

#[test]
fn ids_turns_are_spliced_as_they_are() {
    let tokenizer = Tokenizer::tiny().expect("tokenizer");
    let builder = SequenceBuilder::new(&tokenizer, 4096).expect("builder");
    let messages = &traces()[0];
    let text_chat = Chat::from_messages(messages);
    let text_seq = builder.build(&text_chat).expect("text");
    // A segmentation the tokenizer would never produce: one token per byte-level piece of text.
    let turn = messages.iter().position(|m| m.role == Role::Assistant).expect("assistant");
    let odd: Vec<i64> =
        messages[turn].content.chars().flat_map(|c| tokenizer.encode(&c.to_string()).expect("encodes")).collect();
    assert_ne!(odd, tokenizer.encode(&messages[turn].content).expect("encodes"), "the test needs another segmentation");
    let mut ids_chat = text_chat.clone();
    ids_chat.turns[turn].content = Content::Ids(odd.clone());
    let seq = builder.build(&ids_chat).expect("ids");
    let span = seq.turns[0].clone();
    assert_eq!(&seq.tokens.ids[span.start..span.start + odd.len()], odd.as_slice());
    assert!(seq.tokens.loss_mask[span.clone()].iter().all(|&m| m));
    // The ids turn is closed by the template's end-of-turn token, trained on.
    assert_eq!(span.end, span.start + odd.len() + 1);
    assert_eq!(seq.tokens.ids[span.end - 1], tokenizer.token_id("<|im_end|>").expect("im_end"));
    // Everything before the turn is the text sequence's prefix; masks agree outside the turn.
    let before = text_seq.turns[0].start;
    assert_eq!(seq.tokens.ids[..before], text_seq.tokens.ids[..before]);
    assert_eq!(seq.trained_spans().len(), text_seq.trained_spans().len());
    assert_eq!(
        tokenizer.decode(&seq.tokens.ids).expect("decodes"),
        tokenizer.decode(&text_seq.tokens.ids).expect("decodes")
    );
}

#[test]
fn a_conversation_longer_than_the_context_is_refused() {
    let tokenizer = Tokenizer::tiny().expect("tokenizer");
    let builder = SequenceBuilder::new(&tokenizer, 64).expect("builder");
    let chat = Chat::from_messages(&traces()[0]);
    match builder.build(&chat) {
        Err(e @ SequenceError::TooLong { tokens, context: 64 }) => {
            assert!(tokens > 64);
            assert!(e.to_string().contains("longer than the model's context of 64"), "{e}");
        }
        other => panic!("expected TooLong, got {other:?}"),
    }
}

#[test]
fn bad_lines_are_reported_with_file_and_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = r#"{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}"#;
    let cases = [
        ("{not json", "not JSON"),
        (r#"{"messages": [{"role": "wizard", "content": "x"}]}"#, "unknown role \"wizard\""),
        (
            r#"{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]}"#,
            "empty assistant turn",
        ),
        (r#"{"messages": [{"role": "user", "content": "q"}]}"#, "no assistant turn"),
        (r#"{"prompt": "q"}"#, "expected {\"messages\""),
    ];
    for (bad, expected) in cases {
        let path = dir.path().join("data.jsonl");
        std::fs::write(&path, format!("{good}\n\n{bad}\n")).expect("write");
        let err = read_chats(&path).expect_err(bad).to_string();
        assert!(err.starts_with(&format!("{}:3: ", path.display())), "{err}");
        assert!(err.contains(expected), "{err}");
    }
    let path = dir.path().join("ok.jsonl");
    std::fs::write(&path, format!("{good}\n{good}\n")).expect("write");
    assert_eq!(read_chats(&path).expect("reads").len(), 2);
}
