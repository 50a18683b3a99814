//! `text`: regular-expression find and replace, splitting, counting and case conversion. Regexes
//! use the `regex` crate (linear time, no backtracking), so no pattern can hang the tool; compiled
//! pattern size is capped so none can exhaust its memory either.

use heck::{ToKebabCase, ToLowerCamelCase, ToSnakeCase, ToTitleCase, ToUpperCamelCase};
use regex::{Regex, RegexBuilder};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use toolsmith_sdk::ToolError;

/// Largest compiled regex, in bytes.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// One text operation, chosen by `operation`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "operation", rename_all = "snake_case", deny_unknown_fields)]
pub enum Input {
    /// Finds the matches of `pattern` in `text`.
    Find {
        /// The text to search.
        text: String,
        /// A regular expression (Rust `regex` syntax; `(?i)` for case-insensitive).
        pattern: String,
        /// Return at most this many matches (all by default).
        #[serde(default)]
        #[schemars(range(min = 1))]
        limit: Option<usize>,
    },
    /// Replaces the matches of `pattern` in `text` with `replacement`.
    Replace {
        /// The text to change.
        text: String,
        /// A regular expression.
        pattern: String,
        /// The replacement; `$1` or `${name}` refer to capture groups.
        replacement: String,
        /// Replace at most this many matches (all by default).
        #[serde(default)]
        #[schemars(range(min = 1))]
        limit: Option<usize>,
    },
    /// Splits `text` on a regular expression (on runs of whitespace by default).
    Split {
        /// The text to split.
        text: String,
        /// A regular expression to split on.
        #[serde(default)]
        separator: Option<String>,
    },
    /// Counts characters, bytes, words and lines, and the matches of `pattern` when given.
    Count {
        /// The text to measure.
        text: String,
        /// A regular expression whose matches to count.
        #[serde(default)]
        pattern: Option<String>,
    },
    /// Converts `text` to another case.
    Case {
        /// The text to convert.
        text: String,
        /// The target case.
        to: Case,
    },
}

/// Letter cases for the `case` operation.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Case {
    /// `HELLO WORLD`
    Upper,
    /// `hello world`
    Lower,
    /// `Hello World`
    Title,
    /// `hello_world`
    Snake,
    /// `hello-world`
    Kebab,
    /// `helloWorld`
    Camel,
    /// `HelloWorld`
    Pascal,
}

/// One regex match.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Match {
    /// The matched text.
    pub text: String,
    /// Byte offset of the start.
    pub start: usize,
    /// Byte offset one past the end.
    pub end: usize,
}

/// Text statistics.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Counts {
    /// Unicode scalar values.
    pub chars: usize,
    /// UTF-8 bytes.
    pub bytes: usize,
    /// Whitespace-separated words.
    pub words: usize,
    /// Lines (a trailing newline does not start a new one).
    pub lines: usize,
    /// Matches of `pattern`, when one was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matches: Option<usize>,
}

/// The result; which fields are present depends on the operation.
#[derive(Debug, Default, Serialize, JsonSchema)]
pub struct Output {
    /// `find`: the matches in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matches: Option<Vec<Match>>,
    /// `replace` and `case`: the new text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// `replace`: how many replacements were made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replacements: Option<usize>,
    /// `split`: the pieces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parts: Option<Vec<String>>,
    /// `count`: the statistics.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counts: Option<Counts>,
}

fn compile(pattern: &str) -> Result<Regex, ToolError> {
    RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| ToolError::new("invalid_pattern", format!("`{pattern}` is not a valid regular expression: {e}")))
}

/// Runs one text operation.
pub fn run(input: Input) -> Result<Output, ToolError> {
    Ok(match input {
        Input::Find { text, pattern, limit } => {
            let re = compile(&pattern)?;
            let matches = re
                .find_iter(&text)
                .take(limit.unwrap_or(usize::MAX))
                .map(|m| Match { text: m.as_str().to_owned(), start: m.start(), end: m.end() })
                .collect();
            Output { matches: Some(matches), ..Output::default() }
        }
        Input::Replace { text, pattern, replacement, limit } => {
            let re = compile(&pattern)?;
            let limit = limit.unwrap_or(0); // 0 means "all" to `replacen`
            let found = re.find_iter(&text).count();
            let replacements = if limit == 0 { found } else { found.min(limit) };
            let new = re.replacen(&text, limit, replacement.as_str()).into_owned();
            Output { text: Some(new), replacements: Some(replacements), ..Output::default() }
        }
        Input::Split { text, separator } => {
            let parts = match separator {
                Some(sep) => compile(&sep)?.split(&text).map(str::to_owned).collect(),
                None => text.split_whitespace().map(str::to_owned).collect(),
            };
            Output { parts: Some(parts), ..Output::default() }
        }
        Input::Count { text, pattern } => {
            let matches = match pattern {
                Some(p) => Some(compile(&p)?.find_iter(&text).count()),
                None => None,
            };
            let counts = Counts {
                chars: text.chars().count(),
                bytes: text.len(),
                words: text.split_whitespace().count(),
                lines: text.lines().count(),
                matches,
            };
            Output { counts: Some(counts), ..Output::default() }
        }
        Input::Case { text, to } => {
            let new = match to {
                Case::Upper => text.to_uppercase(),
                Case::Lower => text.to_lowercase(),
                Case::Title => text.to_title_case(),
                Case::Snake => text.to_snake_case(),
                Case::Kebab => text.to_kebab_case(),
                Case::Camel => text.to_lower_camel_case(),
                Case::Pascal => text.to_upper_camel_case(),
            };
            Output { text: Some(new), ..Output::default() }
        }
    })
}

toolsmith_sdk::tool! {
    name: "text",
    description: "Text utilities: regex find (matches with byte offsets), regex replace (with $1 \
                  capture references), split (on a regex or whitespace), count (chars, bytes, \
                  words, lines, pattern matches) and case conversion (upper, lower, title, snake, \
                  kebab, camel, pascal). Choose with `operation`.",
    run: run,
    examples: [
        {"operation": "find", "text": "cat 12, dog 7", "pattern": "\\d+"}
            => {"matches": [{"text": "12", "start": 4, "end": 6}, {"text": "7", "start": 12, "end": 13}]},
        {"operation": "replace", "text": "2024-05-01", "pattern": "(\\d+)-(\\d+)-(\\d+)", "replacement": "$3/$2/$1"}
            => {"text": "01/05/2024", "replacements": 1},
        {"operation": "count", "text": "one two\nthree", "pattern": "o"}
            => {"counts": {"chars": 13, "bytes": 13, "words": 3, "lines": 2, "matches": 2}},
        {"operation": "case", "text": "Hello big World", "to": "snake"}
            => {"text": "hello_big_world"},
        {"operation": "split", "text": "a, b,c", "separator": ",\\s*"}
            => {"parts": ["a", "b", "c"]},
    ],
}
