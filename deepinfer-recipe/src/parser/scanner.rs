//! The markup state machine of the output parser.
//!
//! Input is a byte stream in which every byte knows its provenance: from a
//! reserved (special) token, from ordinary tokens, or unknown (text-only
//! backends). Markers are byte patterns whose bytes also carry a provenance,
//! so `<｜DSML｜` only matches when `｜DSML｜` came from the reserved token
//! id. Bytes are held back only while they may still become a marker, and
//! released with the stage's default action as soon as they cannot.

/// Where a byte came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Provenance {
    /// An ordinary token.
    Plain,
    /// A reserved token id.
    Special,
    /// Text without token boundaries: markers match by spelling.
    Unknown,
}

/// What released bytes mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Content,
    Reasoning,
    /// Text around an extracted JSON value: becomes one space per piece.
    ToSpace,
    Skip,
    StopSequence,
    ToolCallBegin,
    ToolName,
    ToolNameEnd,
    /// A fixed fragment of the arguments JSON (written once per segment).
    ArgLabel(&'static str),
    /// Argument text; string values are JSON-escaped.
    ArgText {
        string: bool,
    },
    /// Closes the arguments object (written once per segment).
    ArgEnd(&'static str),
    /// A fixed content fragment (the opening brace of bare JSON).
    Label(&'static str),
}

/// Parser stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Content { strip: bool },
    Json,
    AfterJson,
    ToolCalls,
    ToolName,
    Args { first: bool },
    ArgName,
    ArgStringAttr,
    ArgValue { string: bool },
    Reasoning { strip: bool },
    Finished,
}

/// Spellings the markers are built from.
#[derive(Debug, Clone)]
pub(crate) struct MarkupSpellings {
    pub dsml: Vec<u8>,
    pub thinking_end: Vec<u8>,
    pub stop_sequences: Vec<Vec<u8>>,
    pub tools: bool,
    pub json: bool,
}

#[derive(Debug, Clone)]
struct Marker {
    /// (byte, must come from a special token)
    units: Vec<(u8, bool)>,
    /// Newlines directly before the marker belong to it.
    absorbs_newlines: bool,
    next: Stage,
    action: Action,
}

fn plain(text: &[u8]) -> impl Iterator<Item = (u8, bool)> + '_ {
    text.iter().map(|&b| (b, false))
}

fn special(text: &[u8]) -> impl Iterator<Item = (u8, bool)> + '_ {
    text.iter().map(|&b| (b, true))
}

fn unit_matches(unit: (u8, bool), byte: u8, provenance: Provenance) -> bool {
    unit.0 == byte
        && match provenance {
            Provenance::Unknown => true,
            Provenance::Plain => !unit.1,
            Provenance::Special => unit.1,
        }
}

/// Markers, default action and leading-newline rule of one stage.
#[derive(Debug, Clone)]
struct StageRules {
    markers: Vec<Marker>,
    default: Action,
    strip_leading_newlines: bool,
    /// Bytes that can start (or be absorbed before) some marker.
    starts: [bool; 256],
    /// Some marker takes the newlines directly before it.
    absorbs_newlines: bool,
    /// Some marker itself starts with a newline (so held newlines may be
    /// the start of a marker, not only absorbed before one).
    newline_starts_marker: bool,
}

fn rules(stage: Stage, m: &MarkupSpellings) -> StageRules {
    let mut markers = Vec::new();
    let tool_open = || Marker {
        units: plain(b"<").chain(special(&m.dsml)).collect(),
        absorbs_newlines: true,
        next: Stage::ToolCalls,
        action: Action::Skip,
    };
    let dsml_close = |next, action| Marker {
        units: plain(b"</").chain(special(&m.dsml)).collect(),
        absorbs_newlines: false,
        next,
        action,
    };
    let literal = |text: &[u8], next, action| Marker {
        units: plain(text).collect(),
        absorbs_newlines: false,
        next,
        action,
    };
    let stops = |markers: &mut Vec<Marker>| {
        for stop in &m.stop_sequences {
            markers.push(literal(stop, Stage::Finished, Action::StopSequence));
        }
    };
    let (default, strip) = match stage {
        Stage::Content { strip } => {
            if m.json {
                markers.push(literal(b"```json\n", Stage::Json, Action::Skip));
                markers.push(literal(b"```\n", Stage::Json, Action::Skip));
                markers.push(literal(b"{", Stage::Json, Action::Label("{")));
                markers.push(literal(b"[", Stage::Json, Action::Label("[")));
            } else {
                stops(&mut markers);
            }
            if m.tools {
                markers.push(tool_open());
            }
            markers.push(Marker {
                units: special(&m.thinking_end).collect(),
                absorbs_newlines: false,
                next: Stage::Content { strip: false },
                action: Action::Skip,
            });
            (
                if m.json {
                    Action::ToSpace
                } else {
                    Action::Content
                },
                strip,
            )
        }
        Stage::Json => {
            stops(&mut markers);
            markers.push(literal(b"\n```", Stage::AfterJson, Action::Skip));
            (Action::Content, false)
        }
        Stage::AfterJson => {
            if m.tools {
                markers.push(tool_open());
            }
            (Action::ToSpace, false)
        }
        Stage::ToolCalls => {
            markers.push(literal(
                b"invoke name=\"",
                Stage::ToolName,
                Action::ToolCallBegin,
            ));
            for name in [&b"tool_calls>"[..], &b" calls>"[..]] {
                markers.push(Marker {
                    units: plain(b"</")
                        .chain(special(&m.dsml))
                        .chain(plain(name))
                        .collect(),
                    absorbs_newlines: false,
                    next: Stage::Finished,
                    action: Action::Skip,
                });
            }
            (Action::Skip, false)
        }
        Stage::ToolName => {
            markers.push(literal(
                b"\"",
                Stage::Args { first: true },
                Action::ToolNameEnd,
            ));
            (Action::ToolName, false)
        }
        Stage::Args { first } => {
            markers.push(literal(
                b"parameter name=",
                Stage::ArgName,
                Action::ArgLabel(if first { "{" } else { ", " }),
            ));
            markers.push(dsml_close(
                Stage::ToolCalls,
                Action::ArgEnd(if first { "{}" } else { "}" }),
            ));
            (Action::Skip, false)
        }
        Stage::ArgName => {
            markers.push(literal(b" ", Stage::ArgStringAttr, Action::ArgLabel(": ")));
            (Action::ArgText { string: false }, false)
        }
        Stage::ArgStringAttr => {
            markers.push(literal(
                b"true\">",
                Stage::ArgValue { string: true },
                Action::ArgLabel("\""),
            ));
            markers.push(literal(
                b"false\">",
                Stage::ArgValue { string: false },
                Action::Skip,
            ));
            (Action::Skip, false)
        }
        Stage::ArgValue { string } => {
            markers.push(dsml_close(
                Stage::Args { first: false },
                if string {
                    Action::ArgLabel("\"")
                } else {
                    Action::Skip
                },
            ));
            (Action::ArgText { string }, false)
        }
        Stage::Reasoning { strip } => {
            if m.tools {
                markers.push(tool_open());
            }
            markers.push(Marker {
                units: special(&m.thinking_end).collect(),
                absorbs_newlines: true,
                next: Stage::Content { strip: true },
                action: Action::Skip,
            });
            (Action::Reasoning, strip)
        }
        Stage::Finished => (Action::Skip, false),
    };
    markers.retain(|marker| !marker.units.is_empty());
    let mut starts = [false; 256];
    for marker in &markers {
        starts[marker.units[0].0 as usize] = true;
        if marker.absorbs_newlines {
            starts[b'\n' as usize] = true;
        }
    }
    if strip {
        starts[b'\n' as usize] = true;
    }
    let newline_starts_marker = markers.iter().any(|marker| marker.units[0].0 == b'\n');
    let absorbs_newlines = markers.iter().any(|marker| marker.absorbs_newlines);
    StageRules {
        markers,
        default,
        strip_leading_newlines: strip,
        starts,
        absorbs_newlines,
        newline_starts_marker,
    }
}

/// The scanner: current stage, its rules, and the held-back bytes.
#[derive(Debug, Clone)]
pub(crate) struct Scanner {
    spellings: MarkupSpellings,
    stage: Stage,
    rules: StageRules,
    held: Vec<(u8, Provenance)>,
    fresh: bool,
    /// Cached rules per stage (stages repeat often inside tool calls).
    cache: Vec<(Stage, StageRules)>,
}

impl Scanner {
    pub fn new(stage: Stage, spellings: MarkupSpellings) -> Self {
        let rules = rules(stage, &spellings);
        Self {
            spellings,
            stage,
            rules,
            held: Vec::new(),
            fresh: true,
            cache: Vec::new(),
        }
    }

    /// When nothing is held and the stage releases ordinary bytes as answer
    /// or reasoning text: that action and the bytes that need the general
    /// path (they may start a marker).
    pub fn idle_text_action(&self) -> Option<(Action, &[bool; 256])> {
        let text = matches!(self.rules.default, Action::Content | Action::Reasoning);
        (text && self.held.is_empty() && self.stage != Stage::Finished)
            .then_some((self.rules.default, &self.rules.starts))
    }

    /// [`Self::idle_text_action`], also when all that is held is newlines
    /// that only wait to be absorbed before a marker: then a byte that
    /// cannot start a marker releases them with the default action.
    pub fn text_action_after_newlines(&self) -> Option<(Action, &[bool; 256])> {
        let text = matches!(self.rules.default, Action::Content | Action::Reasoning);
        let held_ok = self.held.is_empty()
            || (!self.rules.newline_starts_marker
                && self
                    .held
                    .iter()
                    .all(|&(byte, provenance)| byte == b'\n' && provenance != Provenance::Special));
        (text && held_ok && self.stage != Stage::Finished)
            .then_some((self.rules.default, &self.rules.starts))
    }

    /// Bytes (held ones included) were released with the default action
    /// outside [`Self::feed`].
    pub fn note_released_all(&mut self) {
        self.held.clear();
        self.fresh = false;
    }

    /// Whether plain newlines ending a push would simply be held here
    /// (waiting to be absorbed before a marker), after ordinary text that
    /// cannot start a marker (`after_text`) or alone.
    pub fn can_hold_newlines(&self, after_text: bool) -> bool {
        self.rules.absorbs_newlines
            && !self.rules.newline_starts_marker
            && (after_text || !(self.rules.strip_leading_newlines && self.fresh))
    }

    /// What [`Self::feed`] does with such text and `count` newlines: the
    /// text (and anything held) is released, the newlines are held.
    pub fn hold_newlines(&mut self, count: usize, after_text: bool) {
        if after_text {
            self.held.clear();
            self.fresh = false;
        }
        self.held
            .extend(std::iter::repeat_n((b'\n', Provenance::Plain), count));
    }

    /// Bytes were released with the default action outside [`Self::feed`].
    pub fn note_released(&mut self) {
        self.fresh = false;
    }

    #[cfg(test)]
    pub fn stage(&self) -> Stage {
        self.stage
    }

    fn enter(&mut self, stage: Stage) {
        let rules = match self.cache.iter().find(|(cached, _)| *cached == stage) {
            Some((_, rules)) => rules.clone(),
            None => {
                let rules = rules(stage, &self.spellings);
                self.cache.push((stage, rules.clone()));
                rules
            }
        };
        self.stage = stage;
        self.rules = rules;
        self.held.clear();
        self.fresh = true;
    }

    /// Feed bytes of one provenance; append `(action, byte count)` segments
    /// to `out` in stream order.
    pub fn feed(&mut self, bytes: &[u8], provenance: Provenance, out: &mut Vec<(Action, usize)>) {
        let mut index = 0;
        while index < bytes.len() {
            if self.stage == Stage::Finished {
                push(out, Action::Skip, bytes.len() - index);
                return;
            }
            // Fast path: nothing held and the byte cannot start a marker.
            if self.held.is_empty() {
                let run = bytes[index..]
                    .iter()
                    .take_while(|&&b| !self.rules.starts[b as usize])
                    .count();
                if run > 0 {
                    push(out, self.rules.default, run);
                    self.fresh = false;
                    index += run;
                    continue;
                }
            }
            self.step(bytes[index], provenance, out);
            index += 1;
        }
    }

    fn step(&mut self, byte: u8, provenance: Provenance, out: &mut Vec<(Action, usize)>) {
        self.held.push((byte, provenance));
        // A completed marker wins, in rule order.
        let completed =
            self.rules.markers.iter().find_map(|marker| {
                completed_len(marker, &self.held).map(|len| (marker.clone(), len))
            });
        if let Some((marker, len)) = completed {
            let before = self.held.len() - len;
            push(out, self.rules.default, before);
            push(out, marker.action, len);
            self.enter(marker.next);
            return;
        }
        if self.rules.strip_leading_newlines && self.fresh && byte == b'\n' && self.held.len() == 1
        {
            push(out, Action::Skip, 1);
            let stage = self.stage;
            self.enter(stage);
            return;
        }
        let keep = self
            .rules
            .markers
            .iter()
            .map(|marker| partial_len(marker, &self.held))
            .max()
            .unwrap_or(0);
        let release = self.held.len() - keep;
        if release > 0 {
            push(out, self.rules.default, release);
            self.held.drain(..release);
            self.fresh = false;
        }
    }

    /// Release whatever is held with the stage's default action.
    pub fn finish(&mut self, out: &mut Vec<(Action, usize)>) {
        let held = self.held.len();
        if held > 0 {
            let default = if self.stage == Stage::Finished {
                Action::Skip
            } else {
                self.rules.default
            };
            push(out, default, held);
            self.held.clear();
        }
    }
}

fn push(out: &mut Vec<(Action, usize)>, action: Action, len: usize) {
    if len == 0 {
        return;
    }
    match out.last_mut() {
        Some((last, count)) if *last == action => *count += len,
        _ => out.push((action, len)),
    }
}

/// If `marker` (with absorbed newlines) ends `held`, its length in `held`.
fn completed_len(marker: &Marker, held: &[(u8, Provenance)]) -> Option<usize> {
    let n = marker.units.len();
    if held.len() < n {
        return None;
    }
    let tail = &held[held.len() - n..];
    if !tail
        .iter()
        .zip(&marker.units)
        .all(|(&(b, p), &unit)| unit_matches(unit, b, p))
    {
        return None;
    }
    let mut len = n;
    if marker.absorbs_newlines {
        len += held[..held.len() - n]
            .iter()
            .rev()
            .take_while(|(b, p)| *b == b'\n' && *p != Provenance::Special)
            .count();
    }
    Some(len)
}

/// The longest suffix of `held` that may still grow into `marker`.
fn partial_len(marker: &Marker, held: &[(u8, Provenance)]) -> usize {
    let n = marker.units.len();
    let longest = (1..n.min(held.len() + 1))
        .rev()
        .find(|&k| {
            held[held.len() - k..]
                .iter()
                .zip(&marker.units[..k])
                .all(|(&(b, p), &unit)| unit_matches(unit, b, p))
        })
        .unwrap_or(0);
    if !marker.absorbs_newlines {
        return longest;
    }
    let newlines = held[..held.len() - longest]
        .iter()
        .rev()
        .take_while(|(b, p)| *b == b'\n' && *p != Provenance::Special)
        .count();
    longest + newlines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spellings(stops: &[&str]) -> MarkupSpellings {
        MarkupSpellings {
            dsml: "｜DSML｜".as_bytes().to_vec(),
            thinking_end: b"</think>".to_vec(),
            stop_sequences: stops.iter().map(|s| s.as_bytes().to_vec()).collect(),
            tools: true,
            json: false,
        }
    }

    #[test]
    fn special_marker_needs_special_provenance() {
        let mut scanner = Scanner::new(Stage::Reasoning { strip: true }, spellings(&[]));
        let mut out = Vec::new();
        scanner.feed(b"abc</think>", Provenance::Plain, &mut out);
        assert_eq!(scanner.stage(), Stage::Reasoning { strip: true });
        scanner.feed(b"</think>", Provenance::Special, &mut out);
        assert_eq!(scanner.stage(), Stage::Content { strip: true });
        assert_eq!(out, vec![(Action::Reasoning, 11), (Action::Skip, 8)]);
    }

    #[test]
    fn stop_prefix_is_held_then_released() {
        let mut scanner = Scanner::new(Stage::Content { strip: false }, spellings(&["END"]));
        let mut out = Vec::new();
        scanner.feed(b"aE", Provenance::Plain, &mut out);
        assert_eq!(out, vec![(Action::Content, 1)]);
        scanner.feed(b"x", Provenance::Plain, &mut out);
        assert_eq!(out, vec![(Action::Content, 3)]);
        scanner.feed(b"EN", Provenance::Plain, &mut out);
        scanner.feed(b"D", Provenance::Plain, &mut out);
        assert_eq!(scanner.stage(), Stage::Finished);
        assert_eq!(out.last(), Some(&(Action::StopSequence, 3)));
    }
}
