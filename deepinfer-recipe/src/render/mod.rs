//! Rendering of conversations into DeepSeek V4 and V4.1 prompts.
//!
//! Template text (instructions, separators, tool schemas, arguments, message
//! content) is plain; only the template's own control tokens, image
//! placeholders, and grounding tokens found in assistant history are special.

mod v4;
mod v41;

use crate::conversation::{Content, Conversation, ImageRef, Part, ToolCall, ToolDefinition};
use crate::json_style::{FloatStyle, to_spaced_json};
use crate::prompt::{PromptBuilder, RenderedPrompt};
use crate::special::{SpecialToken, SpecialTokens};

/// Which prompt format to render.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PromptFormat {
    /// DeepSeek V4 (V4-Pro, V4-Flash).
    V4,
    /// DeepSeek V4.1 (V4.1-Flash): adds the system token.
    V41,
}

/// Renders conversations in one prompt format with configurable spellings.
#[derive(Debug, Clone)]
pub struct Renderer {
    format: PromptFormat,
    tokens: SpecialTokens,
}

impl Renderer {
    /// A renderer with the DeepSeek spellings.
    pub fn new(format: PromptFormat) -> Self {
        Self {
            format,
            tokens: SpecialTokens::deepseek(),
        }
    }

    /// Replace the special-token spellings.
    pub fn with_special_tokens(mut self, tokens: SpecialTokens) -> Self {
        self.tokens = tokens;
        self
    }

    /// The format rendered.
    pub fn format(&self) -> PromptFormat {
        self.format
    }

    /// The spellings in use.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.tokens
    }

    /// Render the conversation and, unless the last message is a prefix to
    /// continue, the opening of the next assistant turn.
    pub fn render(&self, conversation: &Conversation) -> RenderedPrompt {
        let mut ctx = Ctx {
            tokens: &self.tokens,
            out: PromptBuilder::new(),
            images: Vec::new(),
        };
        match self.format {
            PromptFormat::V4 => v4::render(&mut ctx, conversation),
            PromptFormat::V41 => v41::render(&mut ctx, conversation),
        }
        let Ctx { out, images, .. } = ctx;
        out.finish(images)
    }
}

/// Rendering state shared by the two formats.
pub(crate) struct Ctx<'a> {
    pub tokens: &'a SpecialTokens,
    pub out: PromptBuilder,
    pub images: Vec<ImageRef>,
}

/// A template fragment.
#[derive(Clone, Copy)]
pub(crate) enum Frag<'a> {
    Plain(&'a str),
    Special(&'a str),
}

impl Ctx<'_> {
    pub fn special(&mut self, token: SpecialToken) {
        let spelling = self.tokens.spelling(token).to_owned();
        self.out.push_special(&spelling);
    }

    pub fn plain(&mut self, text: &str) {
        self.out.push_plain(text);
    }

    /// Content parts: text plain, images as placeholders (recorded in order).
    pub fn content(&mut self, content: &Content) {
        for part in &content.parts {
            match part {
                Part::Text(text) => self.plain(text),
                Part::Image(image) => {
                    self.special(SpecialToken::Image);
                    self.images.push(image.clone());
                }
            }
        }
    }

    /// Assistant content or reasoning: grounding-token spellings become
    /// special tokens, everything else is plain.
    pub fn assistant_text(&mut self, text: &str) {
        let grounding: Vec<(SpecialToken, String)> = SpecialToken::GROUNDING
            .iter()
            .map(|&token| (token, self.tokens.spelling(token).to_owned()))
            .filter(|(_, spelling)| !spelling.is_empty())
            .collect();
        let mut plain_start = 0;
        let mut index = 0;
        while index < text.len() {
            let rest = &text[index..];
            let hit = grounding
                .iter()
                .filter(|(_, spelling)| rest.starts_with(spelling.as_str()))
                .max_by_key(|(_, spelling)| spelling.len());
            if let Some((_, spelling)) = hit {
                self.plain(&text[plain_start..index]);
                self.out.push_special(spelling);
                index += spelling.len();
                plain_start = index;
            } else {
                index += rest.chars().next().map_or(1, char::len_utf8);
            }
        }
        self.plain(&text[plain_start..]);
    }

    /// Write `template`, replacing each `{name}` with its fragment.
    pub fn template(&mut self, template: &str, fragments: &[(&str, Frag<'_>)]) {
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            let Some(close) = rest[open..].find('}') else {
                break;
            };
            let name = &rest[open + 1..open + close];
            match fragments.iter().find(|(key, _)| *key == name) {
                Some((_, fragment)) => {
                    self.plain(&rest[..open]);
                    match fragment {
                        Frag::Plain(text) => self.plain(text),
                        Frag::Special(text) => {
                            self.out.push_special(text);
                        }
                    }
                }
                None => self.plain(&rest[..open + close + 1]),
            }
            rest = &rest[open + close + 1..];
        }
        self.plain(rest);
    }

    /// The DSML tool-call instructions that open a tool prompt.
    pub fn tool_instructions(&mut self, block: &str, invoke: &str, parameter: &str) {
        let dsml = self.tokens.spelling(SpecialToken::Dsml).to_owned();
        let think = self.tokens.spelling(SpecialToken::ThinkingStart).to_owned();
        let think_end = self.tokens.spelling(SpecialToken::ThinkingEnd).to_owned();
        self.template(
            TOOL_INSTRUCTIONS,
            &[
                ("dsml", Frag::Special(&dsml)),
                ("think", Frag::Special(&think)),
                ("think_end", Frag::Special(&think_end)),
                ("block", Frag::Plain(block)),
                ("invoke", Frag::Plain(invoke)),
                ("parameter", Frag::Plain(parameter)),
            ],
        );
    }
}

const TOOL_INSTRUCTIONS: &str = r#"## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<{dsml}{block}>" block like the following:

<{dsml}{block}>
<{dsml}{invoke} name="$TOOL_NAME">
<{dsml}{parameter} name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{dsml}{parameter}>
...
</{dsml}{invoke}>
<{dsml}{invoke} name="$TOOL_NAME2">
...
</{dsml}{invoke}>
</{dsml}{block}>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {think}), you MUST output your complete reasoning inside {think}...{think_end} BEFORE any tool calls or final response.

Otherwise, output directly after {think_end} with tool calls or final response.

### Available Tool Schemas

"#;

/// The closing line of a tool prompt.
pub(crate) const TOOL_PROMPT_END: &str = "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

/// The object a tool prompt lists for one tool.
pub(crate) fn tool_schema(tool: &ToolDefinition, floats: FloatStyle) -> String {
    let value = serde_json::json!({
        "name": tool.name,
        "description": tool.description.as_deref().unwrap_or_default(),
        "parameters": tool.parameters,
    });
    to_spaced_json(&value, floats)
}

/// The DSML parameters of a call: the arguments object's entries, or one
/// `arguments` string holding the raw text when it is not an object.
pub(crate) fn call_parameters(call: &ToolCall) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&call.arguments) {
        Ok(map) => map,
        Err(_) => {
            let mut map = serde_json::Map::new();
            map.insert(
                "arguments".to_owned(),
                serde_json::Value::String(call.arguments.clone()),
            );
            map
        }
    }
}

/// A parameter value as DSML writes it: strings as is (`string="true"`), any
/// other JSON value serialised (`string="false"`).
pub(crate) fn parameter_value(value: &serde_json::Value, floats: FloatStyle) -> (bool, String) {
    match value {
        serde_json::Value::String(text) => (true, text.clone()),
        other => (false, to_spaced_json(other, floats)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grounding_tokens_are_special_others_plain() {
        let tokens = SpecialTokens::deepseek();
        let mut ctx = Ctx {
            tokens: &tokens,
            out: PromptBuilder::new(),
            images: Vec::new(),
        };
        ctx.assistant_text("a<｜ref｜>b<｜User｜>c<｜/ref｜>");
        let rendered = ctx.out.finish(Vec::new());
        assert_eq!(rendered.special_tokens(), ["<｜ref｜>", "<｜/ref｜>"]);
        assert_eq!(rendered.text, "a<｜ref｜>b<｜User｜>c<｜/ref｜>");
    }

    #[test]
    fn template_keeps_unknown_braces() {
        let tokens = SpecialTokens::deepseek();
        let mut ctx = Ctx {
            tokens: &tokens,
            out: PromptBuilder::new(),
            images: Vec::new(),
        };
        ctx.template("{x}{a}{", &[("a", Frag::Special("S"))]);
        let rendered = ctx.out.finish(Vec::new());
        assert_eq!(rendered.text, "{x}S{");
        assert_eq!(rendered.special_ranges, vec![3..4]);
    }
}
