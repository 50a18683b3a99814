//! The tokenizer: any Hugging Face `tokenizer.json` through the `tokenizers` crate, plus the
//! special tokens of `tokenizer_config.json`, and the byte-level BPE of the tiny default model,
//! trained with the same crate, in which every trace tag is one token.

use std::collections::HashSet;
use std::path::Path;

use serde_json::{Value, json};
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, PreTokenizerWrapper, SplitDelimiterBehavior, TokenizerBuilder};

use crate::PolicyError;

/// The tiny model's byte-level BPE (3,377 ids, trace tags as single tokens), trained on
/// `assets/tokenizer-corpus.txt` by `toolsmith policy train-tokenizer`.
pub const TINY_TOKENIZER: &str = include_str!("../assets/tiny-tokenizer.json");

/// The tags of the trace grammar. Each is one token in the tiny model's vocabulary, so the agent
/// can never emit half a tag, and stop conditions and masks work on single ids. They are "added"
/// but not "special" tokens (as Qwen2's `<tool_call>`): decoding keeps them in the text.
pub const TRACE_TAGS: &[&str] = &[
    "<think>",
    "</think>",
    "<plan>",
    "</plan>",
    "<subtask>",
    "</subtask>",
    "<tool_call>",
    "</tool_call>",
    "<observation>",
    "</observation>",
    "<mem>",
    "</mem>",
    "<reflection>",
    "</reflection>",
    "<answer>",
    "</answer>",
    "<graph>",
    "</graph>",
    "<node",
    "</node>",
];

/// Control tokens of the tiny model's ChatML format (special: dropped when decoding text): the
/// end of a document, and the padding.
pub const END_OF_TEXT: &str = "<|endoftext|>";
/// ChatML's start of a turn (`<|im_start|>role\n`).
pub const IM_START: &str = "<|im_start|>";
/// ChatML's end of a turn, which ends a generation.
pub const IM_END: &str = "<|im_end|>";
const CONTROL_TOKENS: &[&str] = &[END_OF_TEXT, IM_START, IM_END];

/// ChatML, as Qwen2 writes it; stored in `tokenizer_config.json` for other tools to use.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// A token's byte range in the text it was encoded from.
pub type Span = (usize, usize);

/// A tokenizer with the special tokens the policy needs.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The same tokenizer with special tokens read as text: for text that must not open a turn.
    plain: tokenizers::Tokenizer,
    /// Added tokens that are not special (trace tags), which `plain` still matches whole.
    added: Vec<String>,
    /// Ids that end a generation (`eos_token` of the config, `<|im_end|>`, ...).
    eos_ids: Vec<i64>,
    pad_id: Option<i64>,
    bos_id: Option<i64>,
    chat_template: Option<String>,
    /// BLAKE3 of the `tokenizer.json` bytes: checkpoints record it to catch mismatched pairs.
    hash: String,
}

fn tokenizer_error(context: &str, e: impl std::fmt::Display) -> PolicyError {
    PolicyError::Tokenizer(format!("{context}: {e}"))
}

impl Tokenizer {
    /// Loads `tokenizer.json` and, when present beside it, `tokenizer_config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, PolicyError> {
        let (bytes, config) = read_files(&dir.join("tokenizer.json"))?;
        Self::from_bytes(&bytes, config.as_ref())
    }

    /// The tiny model's shipped tokenizer (byte-level BPE, trace tags as single tokens, ChatML).
    pub fn tiny() -> Result<Self, PolicyError> {
        Self::from_bytes(TINY_TOKENIZER.as_bytes(), Some(&tiny_tokenizer_config()))
    }

    /// Builds from `tokenizer.json` bytes and an optional parsed `tokenizer_config.json`.
    pub fn from_bytes(bytes: &[u8], config: Option<&Value>) -> Result<Self, PolicyError> {
        let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| tokenizer_error("tokenizer.json", e))?;
        let token_field = |key: &str| -> Option<String> {
            let v = config?.get(key)?;
            // Either "<s>" or {"content": "<s>", ...}.
            v.as_str().or_else(|| v.get("content")?.as_str()).map(str::to_owned)
        };
        let id_of = |token: &str| inner.token_to_id(token).map(i64::from);
        let mut eos_ids: Vec<i64> = Vec::new();
        let named_eos = token_field("eos_token");
        for token in named_eos.iter().map(String::as_str).chain([IM_END, END_OF_TEXT]) {
            // <|im_end|> and <|endoftext|> end a turn wherever they exist (ChatML models).
            if let Some(id) = id_of(token).filter(|id| !eos_ids.contains(id)) {
                eos_ids.push(id);
            }
        }
        let pad_id = token_field("pad_token").and_then(|t| id_of(&t));
        let bos_id = token_field("bos_token").and_then(|t| id_of(&t));
        let chat_template = config.and_then(|c| c.get("chat_template")).and_then(Value::as_str).map(str::to_owned);
        let mut plain = inner.clone();
        plain.set_encode_special_tokens(true);
        let added =
            inner.get_added_tokens_decoder().into_iter().filter(|(_, t)| !t.special).map(|(_, t)| t.content).collect();
        Ok(Self {
            inner,
            plain,
            added,
            eos_ids,
            pad_id,
            bos_id,
            chat_template,
            hash: blake3::hash(bytes).to_hex().to_string(),
        })
    }

    /// Encodes `text` (control tokens in it are read as those tokens), without adding any.
    pub fn encode(&self, text: &str) -> Result<Vec<i64>, PolicyError> {
        let encoding = self.inner.encode(text, false).map_err(|e| tokenizer_error("encode", e))?;
        Ok(encoding.get_ids().iter().map(|&id| i64::from(id)).collect())
    }

    /// Encodes `text` and gives each token's byte range in it (added tokens included), so a
    /// caller can map spans of the text, such as an assistant's turn, to token positions.
    pub fn encode_with_offsets(&self, text: &str) -> Result<(Vec<i64>, Vec<Span>), PolicyError> {
        let encoding = self.inner.encode(text, false).map_err(|e| tokenizer_error("encode", e))?;
        let ids = encoding.get_ids().iter().map(|&id| i64::from(id)).collect();
        Ok((ids, encoding.get_offsets().to_vec()))
    }

    /// [`Tokenizer::encode_with_offsets`] for text that is only text (what a client wrote): no
    /// control token (`<|im_start|>`) and no trace tag (`<tool_call>`) in it is read as that
    /// token, so it cannot open a turn or pose as a call. A tag's characters are tokenized as
    /// the text around them is.
    pub fn encode_plain_with_offsets(&self, text: &str) -> Result<(Vec<i64>, Vec<Span>), PolicyError> {
        // Cut every occurrence of an added token after its first character: neither side is the
        // token any more.
        let mut cuts: Vec<usize> = Vec::new();
        for token in self.added.iter().filter(|t| !t.is_empty()) {
            let first = token.chars().next().map_or(1, char::len_utf8);
            cuts.extend(text.match_indices(token.as_str()).map(|(at, _)| at + first));
        }
        cuts.sort_unstable();
        cuts.dedup();
        let (mut ids, mut spans) = (Vec::new(), Vec::new());
        let mut start = 0;
        for end in cuts.into_iter().chain([text.len()]) {
            if end <= start {
                continue;
            }
            let encoding = self.plain.encode(&text[start..end], false).map_err(|e| tokenizer_error("encode", e))?;
            ids.extend(encoding.get_ids().iter().map(|&id| i64::from(id)));
            spans.extend(encoding.get_offsets().iter().map(|&(a, b)| (a + start, b + start)));
            start = end;
        }
        Ok((ids, spans))
    }

    /// Decodes ids to text, dropping special (control) tokens but keeping trace tags.
    pub fn decode(&self, ids: &[i64]) -> Result<String, PolicyError> {
        let ids = ids
            .iter()
            .map(|&id| u32::try_from(id).map_err(|_| tokenizer_error("decode", format!("invalid token id {id}"))))
            .collect::<Result<Vec<u32>, _>>()?;
        self.inner.decode(&ids, true).map_err(|e| tokenizer_error("decode", e))
    }

    /// Decodes `ids` in one pass (as a stream, so the cost is linear in the number of tokens) and
    /// gives, for each token, the byte offset in the text where the text decoded so far ends. A
    /// token that holds only part of a UTF-8 character adds nothing; the token that completes the
    /// character adds all of it, so offsets never split a character.
    pub fn decode_with_ends(&self, ids: &[i64]) -> Result<(String, Vec<usize>), PolicyError> {
        let mut stream = self.inner.decode_stream(true);
        let mut text = String::new();
        let mut ends = Vec::with_capacity(ids.len());
        for &id in ids {
            let id = u32::try_from(id).map_err(|_| tokenizer_error("decode", format!("invalid token id {id}")))?;
            if let Some(chunk) = stream.step(id).map_err(|e| tokenizer_error("decode", e))? {
                text.push_str(&chunk);
            }
            ends.push(text.len());
        }
        Ok((text, ends))
    }

    /// The id of `token`, if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<i64> {
        self.inner.token_to_id(token).map(i64::from)
    }

    /// Ids in the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The ids that end a generation.
    pub fn eos_ids(&self) -> &[i64] {
        &self.eos_ids
    }

    /// The padding id: the configured pad token, else the first end-of-sequence id, else 0.
    pub fn pad_id(&self) -> i64 {
        self.pad_id.or(self.eos_ids.first().copied()).unwrap_or(0)
    }

    /// The id a sequence starts with, when the tokenizer has one.
    pub fn bos_id(&self) -> Option<i64> {
        self.bos_id
    }

    /// `tokenizer_config.json`'s Jinja chat template, when it has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// BLAKE3 of the `tokenizer.json` bytes, hex.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// The `tokenizers` tokenizer underneath.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// `tokenizer.json` text for this tokenizer.
    pub fn to_json(&self) -> Result<String, PolicyError> {
        self.inner.to_string(false).map_err(|e| tokenizer_error("serialise", e))
    }
}

/// Reads a `tokenizer.json` (bytes) and the `tokenizer_config.json` beside it, if there is one.
pub fn read_files(tokenizer_json: &Path) -> Result<(Vec<u8>, Option<Value>), PolicyError> {
    let bytes = std::fs::read(tokenizer_json).map_err(|e| PolicyError::io(tokenizer_json, e))?;
    let config_path = tokenizer_json.with_file_name("tokenizer_config.json");
    let config = if config_path.exists() {
        let text = std::fs::read_to_string(&config_path).map_err(|e| PolicyError::io(&config_path, e))?;
        let value = serde_json::from_str(&text)
            .map_err(|e| PolicyError::checkpoint(&config_path, format!("invalid JSON: {e}")))?;
        Some(value)
    } else {
        None
    };
    Ok((bytes, config))
}

/// Trains the tiny model's byte-level BPE on `texts`: 256 byte tokens, `vocab_size` in all, the
/// ChatML control tokens first (ids 0..3) and every trace tag as one added token. Deterministic
/// for the same texts and size.
///
/// Capitalised words are pre-tokenized on their own, the space before them a token of its own, so
/// a name has the same ids wherever it stands: after a space in a question, after `"` in a tool
/// call's JSON, after `{` in an answer. With GPT-2's pre-tokenization `In which city was Nesel`
/// gives `ĠN es el` and `{"query":"Nesel` gives `N es el` (and merges can split the two forms
/// differently), so copying a name from the question into a call was a per-token translation a
/// small model must learn for every name start; now it is a plain copy. It costs about one token
/// per capitalised word.
pub fn train_tiny(texts: &[String], vocab_size: usize) -> Result<tokenizers::Tokenizer, PolicyError> {
    let specials: Vec<AddedToken> = CONTROL_TOKENS.iter().map(|t| AddedToken::from(t.to_string(), true)).collect();
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab_size.saturating_sub(TRACE_TAGS.len()))
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect::<HashSet<char>>())
        .build();
    let mut tokenizer = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_normalizer(None::<tokenizers::NormalizerWrapper>)
        .with_pre_tokenizer(Some(tiny_pre_tokenizer()?))
        .with_post_processor(Some(ByteLevel::new(false, true, true)))
        .with_decoder(Some(ByteLevel::new(false, true, true)))
        .build()
        .map_err(|e| tokenizer_error("build", e))?;
    tokenizer.train(&mut trainer, texts.iter()).map_err(|e| tokenizer_error("train", e))?;
    let tags: Vec<AddedToken> =
        TRACE_TAGS.iter().map(|t| AddedToken::from(t.to_string(), false).normalized(false)).collect();
    tokenizer.add_tokens(tags).map_err(|e| tokenizer_error("add trace tags", e))?;
    let mut tokenizer: tokenizers::Tokenizer = tokenizer.into();
    // The control tokens were already in the vocabulary; mark them special for decoding too.
    let control: Vec<AddedToken> = CONTROL_TOKENS.iter().map(|t| AddedToken::from(t.to_string(), true)).collect();
    tokenizer.add_special_tokens(control).map_err(|e| tokenizer_error("add control tokens", e))?;
    Ok(tokenizer)
}

/// Capitalised words isolated, then GPT-2's byte-level pre-tokenization (see [`train_tiny`]).
fn tiny_pre_tokenizer() -> Result<PreTokenizerWrapper, PolicyError> {
    let words = Split::new(SplitPattern::Regex(r"\p{Lu}\p{Ll}*".into()), SplitDelimiterBehavior::Isolated, false)
        .map_err(|e| tokenizer_error("build the pre-tokenizer", e))?;
    Ok(Sequence::new(vec![words.into(), ByteLevel::new(false, true, true).into()]).into())
}

/// `tokenizer_config.json` for the tiny tokenizer (what `transformers` reads beside it).
pub fn tiny_tokenizer_config() -> Value {
    json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": null,
        "eos_token": IM_END,
        "pad_token": END_OF_TEXT,
        "unk_token": null,
        "model_max_length": 2048,
        "chat_template": CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": false,
    })
}
