//! A stream parser's events folded into the finished message: answer text, reasoning, tool
//! calls and the finish reason, as a non-streamed response of any of the protocols reports
//! them.

use super::{BackendFinish, Event, FinishReason};

/// A tool call as the parser streamed it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolCallText {
    /// Function name.
    pub name: String,
    /// Arguments JSON text, concatenated from the argument deltas.
    pub arguments: String,
}

/// The message so far: feed every event with [`Assembled::push`], then ask
/// [`Assembled::finish_reason`] once the backend stopped.
///
/// ```
/// use deepinfer_recipe::parser::{Assembled, BackendFinish, Event, FinishReason};
///
/// let mut msg = Assembled::default();
/// for ev in [
///     Event::Reasoning("Look it up. ".into()),
///     Event::ToolCallStart { index: 0, name: "search".into() },
///     Event::ToolCallArgs { index: 0, delta: "{\"q\":".into() },
///     Event::ToolCallArgs { index: 0, delta: "\"rust\"}".into() },
///     Event::ToolCallEnd { index: 0 },
/// ] {
///     msg.push(&ev);
/// }
/// assert_eq!(msg.reasoning, "Look it up. ");
/// assert_eq!(msg.tool_calls[0].arguments, "{\"q\":\"rust\"}");
/// // The parser saw no finish of its own: the backend's reason stands.
/// assert_eq!(msg.finish_reason(BackendFinish::Length), FinishReason::Length);
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Assembled {
    /// Answer text.
    pub content: String,
    /// Reasoning text.
    pub reasoning: String,
    /// Tool calls in the order they opened.
    pub tool_calls: Vec<ToolCallText>,
    /// The parser's own finish, if it sent one.
    pub parsed_finish: Option<FinishReason>,
    /// The stop sequence that ended the answer, if one did.
    pub stop_sequence: Option<String>,
}

impl Assembled {
    /// Fold one event in. Argument deltas of a call index never opened are dropped (the
    /// parser opens every call before its arguments).
    pub fn push(&mut self, ev: &Event) {
        match ev {
            Event::Content(t) => self.content.push_str(t),
            Event::Reasoning(t) => self.reasoning.push_str(t),
            Event::ToolCallStart { name, .. } => self.tool_calls.push(ToolCallText {
                name: name.clone(),
                arguments: String::new(),
            }),
            Event::ToolCallArgs { index, delta } => {
                if let Some(c) = self.tool_calls.get_mut(*index) {
                    c.arguments.push_str(delta);
                }
            }
            Event::ToolCallEnd { .. } => {}
            Event::Finish {
                reason,
                stop_sequence,
                ..
            } => {
                self.parsed_finish = Some(*reason);
                self.stop_sequence.clone_from(stop_sequence);
            }
        }
    }

    /// Why the message ended, given why the backend stopped: a matched stop sequence wins;
    /// a natural end after tool calls is `ToolCalls`; otherwise the backend's reason.
    pub fn finish_reason(&self, backend: BackendFinish) -> FinishReason {
        match (backend, self.parsed_finish) {
            (_, Some(FinishReason::StopSequence)) => FinishReason::StopSequence,
            (BackendFinish::Stop, Some(FinishReason::ToolCalls)) => FinishReason::ToolCalls,
            (BackendFinish::Stop, _) => FinishReason::Stop,
            (BackendFinish::Length, _) => FinishReason::Length,
            (BackendFinish::ContentFilter, _) => FinishReason::ContentFilter,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finish(reason: FinishReason) -> Event {
        Event::Finish {
            reason,
            stop_sequence: (reason == FinishReason::StopSequence).then(|| "END".into()),
            usage: Default::default(),
        }
    }

    #[test]
    fn text_and_calls_accumulate_and_stray_arguments_are_dropped() {
        let mut m = Assembled::default();
        m.push(&Event::Content("Hel".into()));
        m.push(&Event::Content("lo".into()));
        m.push(&Event::ToolCallArgs {
            index: 3,
            delta: "x".into(),
        });
        m.push(&Event::ToolCallStart {
            index: 0,
            name: "f".into(),
        });
        m.push(&Event::ToolCallArgs {
            index: 0,
            delta: "{}".into(),
        });
        assert_eq!(m.content, "Hello");
        assert_eq!(
            m.tool_calls,
            vec![ToolCallText {
                name: "f".into(),
                arguments: "{}".into()
            }]
        );
    }

    #[test]
    fn finish_reasons_combine_the_parser_and_the_backend() {
        use BackendFinish as B;
        use FinishReason as F;
        let with = |f: Option<F>| {
            let mut m = Assembled::default();
            if let Some(f) = f {
                m.push(&finish(f));
            }
            m
        };
        assert_eq!(
            with(Some(F::StopSequence)).finish_reason(B::Length),
            F::StopSequence
        );
        assert_eq!(
            with(Some(F::StopSequence)).stop_sequence.as_deref(),
            Some("END")
        );
        assert_eq!(
            with(Some(F::ToolCalls)).finish_reason(B::Stop),
            F::ToolCalls
        );
        assert_eq!(with(Some(F::ToolCalls)).finish_reason(B::Length), F::Length);
        assert_eq!(with(None).finish_reason(B::Stop), F::Stop);
        assert_eq!(with(Some(F::Stop)).finish_reason(B::Length), F::Length);
        assert_eq!(with(None).finish_reason(B::ContentFilter), F::ContentFilter);
    }
}
