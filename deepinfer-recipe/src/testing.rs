//! Property-testing helpers (feature `testing`): the conversation and grammar generators and the
//! checks this crate's own tests use, for testing an engine (or a grammar backend) built on the
//! renderer, tokenizer and matchers.
//!
//! - Conversations: [`hostile_text`] (fragments an attacker would type: special-token
//!   spellings, markup, CJK and emoji), [`conversation_fields`] (every user-controlled field of
//!   a conversation), [`ConversationFields::conversation`]; [`check_trust_boundary`] checks that
//!   no user-controlled spelling becomes a reserved id and that the prompt round-trips.
//! - Grammars: [`random_grammar`] / [`random_grammars`] (random recursive EBNF grammars over
//!   [`small_vocab`], each with an independent [`ReferenceGrammar`] that says exactly which
//!   texts and prefixes it accepts), built from [`GrammarExpr`]s, which also describe hand-made
//!   references.
//! - Masks: the vendored V4 [`tokenizer`], its [`grammar_vocab`] and [`eos`], [`mask_of`],
//!   [`allowed`], and [`drive`] (accept tokens, each checked against the mask first).
//!
//! Checks return `Err(description)`; in a proptest, `.map_err(TestCaseError::fail)?`.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use proptest::prelude::*;

use crate::conversation::{Content, Conversation, Message, ToolCall, ToolChoice, ToolDefinition};
use crate::grammar::{GrammarError, GrammarVocab, Matcher};
use crate::{PromptFormat, PromptTokenizer, Renderer, SpecialToken};

// ---------------------------------------------------------------------------
// Conversations

/// Spellings an attacker would try (grounding tokens excluded: they are allowed, by design, in
/// assistant history only).
pub const HOSTILE: &[&str] = &[
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜System｜>",
    "<think>",
    "</think>",
    "｜DSML｜",
    "<｜DSML｜ invoke name=\"x\">",
    "</｜DSML｜ calls>",
    "<｜latest_reminder｜>",
    "<｜image｜>",
    "<dsml:",
    "<|EOT|>",
    "<｜tool▁calls▁begin｜>",
    "<｜place▁holder▁no▁7｜>",
    "<|place_holder_mm_span_0030|>",
    "\n\n",
];

/// The grounding tokens (allowed in assistant history).
pub const GROUNDING: &[&str] = &["<｜ref｜>", "<｜/ref｜>", "<｜box｜>", "<｜/box｜>"];

/// Up to five fragments, concatenated: ASCII with markup characters, CJK and emoji, or a
/// [`HOSTILE`] spelling; with `allow_grounding`, also [`GROUNDING`] tokens.
pub fn hostile_text(allow_grounding: bool) -> BoxedStrategy<String> {
    let base = prop_oneof![
        3 => "[a-zA-Z0-9 .,!?<>/|\"{}]{0,8}",
        1 => "[\\u{4e00}-\\u{4e20}\\u{1F600}-\\u{1F610}]{0,3}",
        3 => proptest::sample::select(HOSTILE).prop_map(str::to_owned),
    ];
    let fragment = if allow_grounding {
        prop_oneof![
            7 => base,
            1 => proptest::sample::select(GROUNDING).prop_map(str::to_owned),
        ]
        .boxed()
    } else {
        base.boxed()
    };
    proptest::collection::vec(fragment, 0..6)
        .prop_map(|parts| parts.concat())
        .boxed()
}

/// Every user-controlled field of a conversation with a system prompt, a user turn, an
/// assistant turn with reasoning and a tool call, the tool's result, a reminder and a tool
/// definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConversationFields {
    /// The system prompt.
    pub system: String,
    /// The user turn.
    pub user: String,
    /// The assistant's reasoning.
    pub reasoning: String,
    /// The assistant's answer.
    pub answer: String,
    /// The called tool's name.
    pub call_name: String,
    /// A key of the call's arguments.
    pub arg_key: String,
    /// Its value.
    pub arg_value: String,
    /// The tool's result.
    pub result: String,
    /// The defined tool's name.
    pub tool_name: String,
    /// Its description.
    pub tool_description: String,
    /// The latest reminder.
    pub reminder: String,
}

/// [`ConversationFields`] of [`hostile_text`] (no grounding tokens).
pub fn conversation_fields() -> impl Strategy<Value = ConversationFields> {
    (
        (
            hostile_text(false),
            hostile_text(false),
            hostile_text(false),
            hostile_text(false),
            hostile_text(false),
            hostile_text(false),
        ),
        (
            hostile_text(false),
            hostile_text(false),
            hostile_text(false),
            hostile_text(false),
            hostile_text(false),
        ),
    )
        .prop_map(|((a, b, c, d, e, f), (g, h, i, j, k))| ConversationFields {
            system: a,
            user: b,
            reasoning: c,
            answer: d,
            call_name: e,
            arg_key: f,
            arg_value: g,
            result: h,
            tool_name: i,
            tool_description: j,
            reminder: k,
        })
}

/// The key of the numeric argument every generated tool call carries beside the user's.
const FIXED_ARG_KEY: &str = "n";

impl ConversationFields {
    /// The conversation holding these fields (thinking on or off).
    pub fn conversation(&self, thinking: bool) -> Conversation {
        let mut map = serde_json::Map::new();
        map.insert(
            self.arg_key.clone(),
            serde_json::Value::from(self.arg_value.clone()),
        );
        // A second, numeric argument; a user key spelled the same keeps its own value.
        map.entry(FIXED_ARG_KEY)
            .or_insert(serde_json::Value::from(1));
        let arguments = serde_json::Value::Object(map).to_string();
        Conversation {
            messages: vec![
                Message::system(self.system.clone()),
                Message::user(self.user.clone()),
                Message::Assistant {
                    content: self.answer.clone(),
                    reasoning: Some(self.reasoning.clone()),
                    tool_calls: Some(vec![ToolCall {
                        id: "c1".into(),
                        name: self.call_name.clone(),
                        arguments,
                    }]),
                    prefix: false,
                },
                Message::Tool {
                    content: Content::text(self.result.clone()),
                    tool_call_id: Some("c1".into()),
                },
                Message::LatestReminder {
                    content: self.reminder.clone(),
                },
            ],
            thinking,
            tools: vec![ToolDefinition {
                name: self.tool_name.clone(),
                description: Some(self.tool_description.clone()),
                parameters: serde_json::json!({"type": "object"}),
                strict: None,
                defer_loading: false,
            }],
            tool_choice: ToolChoice::Auto,
            ..Conversation::default()
        }
    }

    /// The same fields, each replaced by `"x"`: the conversation whose special tokens are the
    /// template's alone.
    pub fn blank(&self) -> Self {
        let x = |_: &String| "x".to_owned();
        ConversationFields {
            system: x(&self.system),
            user: x(&self.user),
            reasoning: x(&self.reasoning),
            answer: x(&self.answer),
            call_name: x(&self.call_name),
            // The fixed key stays itself so the blank has the same number of arguments.
            arg_key: if self.arg_key == FIXED_ARG_KEY {
                FIXED_ARG_KEY.to_owned()
            } else {
                "x".to_owned()
            },
            arg_value: x(&self.arg_value),
            result: x(&self.result),
            tool_name: x(&self.tool_name),
            tool_description: x(&self.tool_description),
            reminder: x(&self.reminder),
        }
    }
}

/// Checks the trust boundary on `fields` rendered in `format`: the encoded prompt holds exactly
/// one reserved id per special range of the rendering, the rendering's special tokens are those
/// of the [`ConversationFields::blank`] conversation (no user-controlled spelling became one),
/// and decoding the ids gives back the prompt text.
pub fn check_trust_boundary(
    tokenizer: &PromptTokenizer,
    format: PromptFormat,
    fields: &ConversationFields,
    thinking: bool,
) -> Result<(), String> {
    let reserved = tokenizer.reserved_ids();
    let renderer = Renderer::new(format);
    let rendered = renderer.render(&fields.conversation(thinking));
    let ids = tokenizer.encode(&rendered).map_err(|e| e.to_string())?;
    let reserved_count = ids.iter().filter(|id| reserved.contains(id)).count();
    if reserved_count != rendered.special_ranges.len() {
        return Err(format!(
            "{format:?}: {reserved_count} reserved ids for {} special ranges",
            rendered.special_ranges.len()
        ));
    }
    // The template's special tokens are exactly those of the same conversation with every
    // user-controlled field replaced by "x".
    let reference = renderer.render(&fields.blank().conversation(thinking));
    if rendered.special_tokens() != reference.special_tokens() {
        return Err(format!(
            "{format:?}: special tokens {:?}, the template's {:?}",
            rendered.special_tokens(),
            reference.special_tokens()
        ));
    }
    // Round trip: decoding the ids gives back the prompt text.
    let decoded = tokenizer.decode(&ids).map_err(|e| e.to_string())?;
    if decoded != rendered.text {
        return Err(format!(
            "{format:?}: decoded {decoded:?}, rendered {:?}",
            rendered.text
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Vocabulary and masks

/// The vendored DeepSeek V4 tokenizer, loaded once per process.
///
/// # Panics
///
/// If the vendored tokenizer does not load.
pub fn tokenizer() -> Arc<PromptTokenizer> {
    static TOKENIZER: OnceLock<Arc<PromptTokenizer>> = OnceLock::new();
    TOKENIZER
        .get_or_init(|| Arc::new(PromptTokenizer::deepseek_v4().expect("vendored tokenizer loads")))
        .clone()
}

/// The vendored tokenizer's end-of-sequence id.
pub fn eos() -> u32 {
    tokenizer()
        .special_id(SpecialToken::Eos.deepseek_spelling())
        .expect("the V4 tokenizer has an end-of-sequence token")
}

/// The grammar vocabulary of the vendored tokenizer (EOS ends a grammar, the DSML marker is
/// symbol 0), built once per process.
pub fn grammar_vocab() -> Arc<GrammarVocab> {
    static VOCAB: OnceLock<Arc<GrammarVocab>> = OnceLock::new();
    VOCAB
        .get_or_init(|| {
            let tokenizer = tokenizer();
            let dsml = tokenizer
                .special_id(SpecialToken::Dsml.deepseek_spelling())
                .expect("the V4 tokenizer has the DSML marker");
            Arc::new(GrammarVocab::from_tokenizer(
                &tokenizer,
                &[eos()],
                &[(dsml, 0)],
            ))
        })
        .clone()
}

/// Whether token `id` is allowed by a grammar bitmask.
pub fn allowed(mask: &[u32], id: u32) -> bool {
    mask[id as usize / 32] & (1 << (id % 32)) != 0
}

/// The matcher's current bitmask over [`grammar_vocab`].
///
/// # Panics
///
/// If the matcher cannot fill a mask (it is over another vocabulary, say).
pub fn mask_of(matcher: &mut dyn Matcher) -> Vec<u32> {
    let mut mask = vec![0u32; grammar_vocab().mask_words()];
    matcher
        .fill_bitmask(&mut mask)
        .expect("a mask over the grammar vocabulary");
    mask
}

/// Accepts `ids` one by one, each after checking that the matcher's mask (over
/// [`grammar_vocab`]) allows it. Returns the matcher's first error.
///
/// # Panics
///
/// If a token the matcher would be given is not in its mask.
pub fn drive(matcher: &mut dyn Matcher, ids: &[u32]) -> Result<(), GrammarError> {
    let mut mask = vec![0u32; grammar_vocab().mask_words()];
    for &id in ids {
        matcher.fill_bitmask(&mut mask)?;
        assert!(allowed(&mask, id), "token {id} not in mask");
        matcher.accept(id)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Reference grammars

/// An expression of a [`ReferenceGrammar`].
#[derive(Debug, Clone)]
pub enum GrammarExpr {
    /// A literal.
    Lit(&'static str),
    /// One character: the predicate, and characters to generate from.
    Char(fn(char) -> bool, &'static str),
    /// A sequence.
    Seq(Vec<GrammarExpr>),
    /// Alternatives; generation at the depth limit takes the first.
    Alt(Vec<GrammarExpr>),
    /// Zero or more repetitions.
    Star(Box<GrammarExpr>),
    /// A rule, by index (0 is the start rule).
    Rule(usize),
}

impl GrammarExpr {
    /// A sequence.
    pub fn seq(items: Vec<GrammarExpr>) -> Self {
        Self::Seq(items)
    }

    /// Alternatives.
    pub fn alt(items: Vec<GrammarExpr>) -> Self {
        Self::Alt(items)
    }

    /// Zero or more repetitions.
    pub fn star(item: GrammarExpr) -> Self {
        Self::Star(Box::new(item))
    }
}

/// Input ended inside a match that could go on.
const PARTIAL: usize = usize::MAX;

/// An independent recognizer: a memoised recursive-descent matcher over [`GrammarExpr`] rules
/// (rule 0 the start), written without the crate's regexes or automata. It cannot run
/// left-recursive rules.
#[derive(Debug, Clone)]
pub struct ReferenceGrammar {
    rules: Vec<GrammarExpr>,
    /// Rules that derive some finite text.
    productive: Vec<bool>,
}

/// Whether `g` derives some finite text, given the productive rules.
fn finishes(g: &GrammarExpr, productive: &[bool]) -> bool {
    match g {
        GrammarExpr::Lit(_) | GrammarExpr::Char(..) | GrammarExpr::Star(_) => true,
        GrammarExpr::Seq(items) => items.iter().all(|i| finishes(i, productive)),
        GrammarExpr::Alt(options) => options.iter().any(|o| finishes(o, productive)),
        GrammarExpr::Rule(rule) => productive[*rule],
    }
}

impl ReferenceGrammar {
    /// The grammar of `rules` (rule 0 the start).
    pub fn new(rules: Vec<GrammarExpr>) -> Self {
        let mut productive = vec![false; rules.len()];
        loop {
            let next: Vec<bool> = rules.iter().map(|r| finishes(r, &productive)).collect();
            if next == productive {
                return Self { rules, productive };
            }
            productive = next;
        }
    }

    /// Whether rule `rule` derives some finite text (for the start rule: whether the grammar is
    /// satisfiable).
    pub fn is_productive(&self, rule: usize) -> bool {
        self.productive[rule]
    }

    /// End positions of `g` matched from `pos` (with [`PARTIAL`] when the input ran out inside
    /// it).
    fn ends(
        &self,
        g: &GrammarExpr,
        input: &[u8],
        pos: usize,
        memo: &mut HashMap<(usize, usize), Vec<usize>>,
    ) -> Vec<usize> {
        let mut out = match g {
            GrammarExpr::Lit(text) => {
                let rest = &input[pos..];
                if rest.starts_with(text.as_bytes()) {
                    vec![pos + text.len()]
                } else if text.as_bytes().starts_with(rest) {
                    vec![PARTIAL]
                } else {
                    vec![]
                }
            }
            GrammarExpr::Char(predicate, _) => {
                let rest = &input[pos..];
                let Some(&first) = rest.first() else {
                    return vec![PARTIAL];
                };
                let width = match first {
                    0x00..=0x7F => 1,
                    0xC0..=0xDF => 2,
                    0xE0..=0xEF => 3,
                    0xF0..=0xF7 => 4,
                    _ => return vec![],
                };
                if rest.len() < width {
                    let continuation = rest[1..].iter().all(|b| b & 0xC0 == 0x80);
                    return if continuation { vec![PARTIAL] } else { vec![] };
                }
                match std::str::from_utf8(&rest[..width]) {
                    Ok(text) if text.chars().next().is_some_and(predicate) => vec![pos + width],
                    _ => vec![],
                }
            }
            GrammarExpr::Seq(items) => {
                let mut at = vec![pos];
                for (i, item) in items.iter().enumerate() {
                    let mut next = Vec::new();
                    for &p in &at {
                        if p == PARTIAL {
                            // Viable only if the rest can still finish.
                            if items[i..].iter().all(|r| finishes(r, &self.productive)) {
                                next.push(PARTIAL);
                            }
                        } else {
                            next.extend(self.ends(item, input, p, memo));
                        }
                    }
                    next.sort_unstable();
                    next.dedup();
                    at = next;
                }
                at
            }
            GrammarExpr::Alt(options) => options
                .iter()
                .flat_map(|o| self.ends(o, input, pos, memo))
                .collect(),
            GrammarExpr::Star(inner) => {
                let mut all = vec![pos];
                let mut frontier = vec![pos];
                while let Some(p) = frontier.pop() {
                    for end in self.ends(inner, input, p, memo) {
                        if !all.contains(&end) {
                            all.push(end);
                            if end != PARTIAL {
                                frontier.push(end);
                            }
                        }
                    }
                }
                all
            }
            GrammarExpr::Rule(rule) => {
                if let Some(found) = memo.get(&(*rule, pos)) {
                    return found.clone();
                }
                memo.insert((*rule, pos), Vec::new());
                let found = self.ends(&self.rules[*rule], input, pos, memo);
                memo.insert((*rule, pos), found.clone());
                found
            }
        };
        out.sort_unstable();
        out.dedup();
        out
    }

    fn run(&self, input: &[u8]) -> Vec<usize> {
        self.ends(&GrammarExpr::Rule(0), input, 0, &mut HashMap::new())
    }

    /// Whether the grammar derives exactly `input`.
    pub fn accepts(&self, input: &[u8]) -> bool {
        self.run(input).contains(&input.len())
    }

    /// Whether `input` is a prefix of some text the grammar derives.
    pub fn accepts_prefix(&self, input: &[u8]) -> bool {
        let ends = self.run(input);
        ends.contains(&input.len()) || ends.contains(&PARTIAL)
    }

    fn generate(&self, g: &GrammarExpr, rng: &mut Rng, depth: usize, out: &mut String) {
        match g {
            GrammarExpr::Lit(text) => out.push_str(text),
            GrammarExpr::Char(predicate, samples) => {
                let chars: Vec<char> = samples.chars().filter(|&c| predicate(c)).collect();
                out.push(chars[rng.below(chars.len())]);
            }
            GrammarExpr::Seq(items) => items.iter().for_each(|i| self.generate(i, rng, depth, out)),
            GrammarExpr::Alt(options) => {
                let pick = if depth == 0 {
                    0
                } else {
                    rng.below(options.len())
                };
                self.generate(&options[pick], rng, depth, out);
            }
            GrammarExpr::Star(inner) => {
                let count = if depth == 0 { 0 } else { rng.below(3) };
                for _ in 0..count {
                    self.generate(inner, rng, depth, out);
                }
            }
            GrammarExpr::Rule(rule) => {
                self.generate(&self.rules[*rule], rng, depth.saturating_sub(1), out);
            }
        }
    }

    /// A text of the grammar generated from `seed`, rules nested at most `depth` deep (at the
    /// limit, alternatives take their first option and repetitions none: the first option must
    /// finish).
    pub fn sample(&self, seed: u64, depth: usize) -> String {
        let mut out = String::new();
        self.generate(&GrammarExpr::Rule(0), &mut Rng(seed | 1), depth, &mut out);
        out
    }
}

/// xorshift64: generation draws from a proptest-chosen seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// The words random grammars are made of.
pub const WORDS: [&str; 5] = ["a", "b", "(", ")", "ab"];

/// The tokens of [`small_vocab`], by id (id 8 is end of sequence).
pub const SMALL_TOKENS: [&str; 8] = ["a", "b", "(", ")", "ab", "((", ")a", "b)"];

/// A grammar vocabulary of single characters, a few merged pairs ([`SMALL_TOKENS`]) and end of
/// sequence (id 8): what [`random_grammar`]s are compiled over.
pub fn small_vocab() -> Arc<GrammarVocab> {
    let tokens = SMALL_TOKENS
        .iter()
        .map(|t| Some(t.as_bytes().to_vec()))
        .chain([None])
        .collect();
    Arc::new(GrammarVocab::new(tokens, &[8], &[]))
}

/// A random grammar, as [`random_grammar`] builds it.
#[derive(Debug, Clone)]
pub struct RandomGrammar {
    /// Its reference recognizer.
    pub reference: ReferenceGrammar,
    /// The same grammar as EBNF text (rule 0 is `root`).
    pub ebnf: String,
    /// Whether some rule starts an alternative with itself (immediate left recursion, which the
    /// crate rewrites or refuses and the reference cannot run).
    pub left_recursive: bool,
}

/// A random grammar of up to three rules over [`WORDS`], built from `seed`: literals, starred
/// and optional literals, and rule references (recursion included).
pub fn random_grammar(seed: u64) -> RandomGrammar {
    use GrammarExpr as G;
    let mut rng = Rng(seed | 1);
    let rules = 1 + rng.below(3);
    let mut bodies = Vec::new();
    let mut texts = Vec::new();
    let mut immediate = false;
    let name = |k: usize| {
        if k == 0 {
            "root".to_owned()
        } else {
            format!("r{k}")
        }
    };
    for rule in 0..rules {
        let mut options = Vec::new();
        let mut option_texts = Vec::new();
        for _ in 0..1 + rng.below(3) {
            let mut items = Vec::new();
            let mut item_texts = Vec::new();
            for _ in 0..rng.below(4) {
                let word = WORDS[rng.below(WORDS.len())];
                let (item, text) = match rng.below(6) {
                    0 | 1 => (G::Lit(word), format!("{word:?}")),
                    2 => (G::star(G::Lit(word)), format!("({word:?})*")),
                    3 => (G::alt(vec![G::Lit(word), G::Lit("")]), format!("{word:?}?")),
                    _ => {
                        let k = rng.below(rules);
                        (G::Rule(k), name(k))
                    }
                };
                items.push(item);
                item_texts.push(text);
            }
            immediate |= matches!(items.first(), Some(G::Rule(k)) if *k == rule);
            if item_texts.is_empty() {
                item_texts.push("\"\"".to_owned());
            }
            options.push(G::seq(items));
            option_texts.push(item_texts.join(" "));
        }
        bodies.push(G::alt(options));
        texts.push(option_texts.join(" | "));
    }
    let ebnf = texts
        .iter()
        .enumerate()
        .map(|(k, body)| format!("{} ::= {body}\n", name(k)))
        .collect();
    RandomGrammar {
        reference: ReferenceGrammar::new(bodies),
        ebnf,
        left_recursive: immediate,
    }
}

/// [`random_grammar`]s from random seeds.
pub fn random_grammars() -> impl Strategy<Value = RandomGrammar> {
    any::<u64>().prop_map(random_grammar)
}
