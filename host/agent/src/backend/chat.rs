//! Chat templates: the Jinja `chat_template` of a tokenizer config rendered with minijinja (with
//! the Python string methods Hugging Face templates use).

use minijinja::{Environment, Error, ErrorKind, context};

use super::{BackendError, Message};

/// Renders `messages` with `template`; `add_generation_prompt` opens the assistant's turn.
pub fn render_chat(
    template: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String, BackendError> {
    ChatTemplate::new(template, bos_token, eos_token)?.render(messages, add_generation_prompt)
}

/// A chat template compiled once, for callers that render many conversations (the trainer
/// renders every prefix of every example).
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compiles `template`.
    pub fn new(template: &str, bos_token: &str, eos_token: &str) -> Result<Self, BackendError> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned("chat", template.to_string()).map_err(|e| BackendError::Template(e.to_string()))?;
        Ok(ChatTemplate { env, bos_token: bos_token.into(), eos_token: eos_token.into() })
    }

    /// The tokenizer's template (ChatML when it has none), rendered as [`render_prompt`] does.
    pub fn of(tokenizer: &toolsmith_policy::Tokenizer) -> Result<Self, BackendError> {
        Self::new(tokenizer.chat_template().unwrap_or(toolsmith_policy::tokenizer::CHATML_TEMPLATE), "", "")
    }

    /// Renders `messages`; `add_generation_prompt` opens the assistant's turn.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String, BackendError> {
        let t = self.env.get_template("chat").map_err(|e| BackendError::Template(e.to_string()))?;
        t.render(context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token,
            eos_token => self.eos_token,
        })
        .map_err(|e| BackendError::Template(e.to_string()))
    }
}

/// The prompt text for `messages` with the assistant's turn opened: the tokenizer's chat
/// template, or ChatML when it has none.
pub fn render_prompt(tokenizer: &toolsmith_policy::Tokenizer, messages: &[Message]) -> Result<String, BackendError> {
    ChatTemplate::of(tokenizer)?.render(messages, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_renders_like_transformers() {
        let messages = [Message::system("be brief"), Message::user("hi")];
        let text = render_chat(toolsmith_policy::tokenizer::CHATML_TEMPLATE, &messages, true, "", "").expect("renders");
        assert_eq!(
            text,
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        let err = render_chat("{{ raise_exception('no system role') }}", &messages, true, "", "");
        assert!(matches!(err, Err(BackendError::Template(m)) if m.contains("no system role")));
    }
}
