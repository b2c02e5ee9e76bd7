//! JSON text as the prompt formats write it: `", "` and `": "` separators
//! (Python `json.dumps` style), non-ASCII unescaped, object keys in their
//! original order. V4.1 also writes small floats the Python way (`1e-05`).

use std::io;

use serde::Serialize;
use serde_json::ser::{CompactFormatter, Formatter};

/// Float spelling used by [`to_spaced_json`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatStyle {
    /// `serde_json`'s shortest representation (V4 prompts).
    Rust,
    /// Python-like: below `1e-4` in exponent form, exponents at least two digits (V4.1 prompts).
    Python,
}

struct Spaced {
    floats: FloatStyle,
}

impl Formatter for Spaced {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(b": ")
    }

    fn write_f64<W: ?Sized + io::Write>(&mut self, writer: &mut W, value: f64) -> io::Result<()> {
        let mut plain = Vec::with_capacity(24);
        CompactFormatter.write_f64(&mut plain, value)?;
        match self.floats {
            FloatStyle::Rust => writer.write_all(&plain),
            FloatStyle::Python => writer.write_all(pythonise_float(&plain).as_bytes()),
        }
    }
}

/// Rewrite `serde_json`'s float text the way Python's `repr` spells small
/// magnitudes: `0.00001` → `1e-05`, `1e-7` → `1e-07`.
fn pythonise_float(text: &[u8]) -> String {
    let text = String::from_utf8_lossy(text).into_owned();
    let (sign, body) = match text.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", text.as_str()),
    };
    if let Some((mantissa, exponent)) = body.split_once("e-") {
        if exponent.len() == 1 {
            return format!("{sign}{mantissa}e-0{exponent}");
        }
        return text;
    }
    if let Some(fraction) = body.strip_prefix("0.") {
        let zeros = fraction.bytes().take_while(|&b| b == b'0').count();
        let digits = &fraction[zeros..];
        if zeros >= 4 && !digits.is_empty() {
            let (first, rest) = digits.split_at(1);
            let dot = if rest.is_empty() { "" } else { "." };
            return format!("{sign}{first}{dot}{rest}e-{:02}", zeros + 1);
        }
    }
    text
}

/// Serialise `value` with spaced separators and the given float style.
pub fn to_spaced_json(value: &serde_json::Value, floats: FloatStyle) -> String {
    let mut out = Vec::with_capacity(128);
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, Spaced { floats });
    // Serialising a `Value` into memory cannot fail: keys are strings and
    // numbers are finite by construction.
    if value.serialize(&mut serializer).is_err() {
        return value.to_string();
    }
    String::from_utf8(out).unwrap_or_else(|_| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn separators_and_order() {
        let value: serde_json::Value =
            serde_json::from_str(r#"{"b": 1, "a": [true, null, "é"]}"#).unwrap();
        assert_eq!(
            to_spaced_json(&value, FloatStyle::Rust),
            r#"{"b": 1, "a": [true, null, "é"]}"#
        );
    }

    #[test]
    fn float_styles() {
        let value = json!([0.00001, 1e-7, 0.5, -0.000012, 2.0]);
        assert_eq!(
            to_spaced_json(&value, FloatStyle::Python),
            "[1e-05, 1e-07, 0.5, -1.2e-05, 2.0]"
        );
        assert_eq!(
            to_spaced_json(&value, FloatStyle::Rust),
            "[0.00001, 1e-7, 0.5, -0.000012, 2.0]"
        );
    }
}
