//! Integer ranges (`minimum` / `maximum` and their exclusive forms) as
//! regular expressions over JSON integers (no leading zeros, no `-0`).

use serde_json::{Map, Value};

use super::GrammarError;

/// Inclusive lower and upper bounds, each optional.
pub type Bounds = (Option<i128>, Option<i128>);

/// The inclusive integer bounds a schema sets, or `None` when it sets none.
pub fn integer_bounds(object: &Map<String, Value>) -> Result<Option<Bounds>, GrammarError> {
    let number = |key: &str| -> Result<Option<f64>, GrammarError> {
        match object.get(key) {
            None | Some(Value::Bool(_)) => Ok(None),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(x) if x.abs() < 1e18 => Ok(Some(x)),
                _ => Err(GrammarError::Unsupported(format!(
                    "`{key}` {n} is out of range"
                ))),
            },
            Some(other) => Err(GrammarError::Unsupported(format!(
                "`{key}` must be a number, not {other}"
            ))),
        }
    };
    // Draft 4 spells exclusivity as a boolean next to minimum / maximum.
    let flag = |key: &str| object.get(key) == Some(&Value::Bool(true));
    let mut low = number("minimum")?.map(|x| {
        let low = x.ceil() as i128;
        if flag("exclusiveMinimum") && low as f64 == x {
            low + 1
        } else {
            low
        }
    });
    if let Some(x) = number("exclusiveMinimum")? {
        let bound = x.floor() as i128 + 1;
        low = Some(low.map_or(bound, |low| low.max(bound)));
    }
    let mut high = number("maximum")?.map(|x| {
        let high = x.floor() as i128;
        if flag("exclusiveMaximum") && high as f64 == x {
            high - 1
        } else {
            high
        }
    });
    if let Some(x) = number("exclusiveMaximum")? {
        let bound = x.ceil() as i128 - 1;
        high = Some(high.map_or(bound, |high| high.min(bound)));
    }
    Ok((low.is_some() || high.is_some()).then_some((low, high)))
}

/// A regex for the JSON integers in `[low, high]` (each bound optional).
pub fn integer_range_regex(low: Option<i128>, high: Option<i128>) -> Result<String, GrammarError> {
    if let (Some(low), Some(high)) = (low, high)
        && low > high
    {
        return Err(GrammarError::Unsatisfiable);
    }
    let mut alternatives = Vec::new();
    // Negative part: -n for n in [max(1, -high), -low].
    if low.is_none_or(|low| low < 0) {
        let abs_low = high.map_or(1, |high| (-high).max(1)) as u128;
        let abs_high = low.map(|low| (-low) as u128);
        alternatives.push(format!("-{}", unsigned_range(abs_low, abs_high)));
    }
    // Non-negative part.
    if high.is_none_or(|high| high >= 0) {
        let from = low.map_or(0, |low| low.max(0)) as u128;
        alternatives.push(unsigned_range(from, high.map(|high| high as u128)));
    }
    Ok(format!("(?:{})", alternatives.join("|")))
}

/// Decimal numbers without leading zeros in `[low, high]` (`low <= high`).
fn unsigned_range(low: u128, high: Option<u128>) -> String {
    let digits = |n: u128| n.to_string().len();
    let top = |d: usize| 10u128.pow(d as u32) - 1;
    let bottom = |d: usize| if d == 1 { 0 } else { 10u128.pow(d as u32 - 1) };
    let first = digits(low);
    let last = high.map_or(first, digits);
    let mut alternatives = Vec::new();
    for d in first..=last {
        let from = low.max(bottom(d));
        let to = high.map_or(top(d), |high| high.min(top(d)));
        alternatives.push(same_length(
            from.to_string().as_bytes(),
            to.to_string().as_bytes(),
        ));
    }
    if high.is_none() {
        // Any number with more digits.
        alternatives.push(format!("[1-9][0-9]{{{last},}}"));
    }
    format!("(?:{})", alternatives.join("|"))
}

/// Digit strings of one length from `low` to `high` inclusive.
fn same_length(low: &[u8], high: &[u8]) -> String {
    let Some((&l, low_rest)) = low.split_first() else {
        return String::new();
    };
    let (&h, high_rest) = high.split_first().unwrap_or((&b'9', &[]));
    let rest = low_rest.len();
    let any = |n: usize| match n {
        0 => String::new(),
        n => format!("[0-9]{{{n}}}"),
    };
    if l == h {
        return format!("{}{}", l as char, same_length(low_rest, high_rest));
    }
    let low_full = low_rest.iter().all(|&b| b == b'0');
    let high_full = high_rest.iter().all(|&b| b == b'9');
    let mut alternatives = Vec::new();
    let mut from = l;
    if !low_full {
        let nines = vec![b'9'; rest];
        alternatives.push(format!("{}{}", l as char, same_length(low_rest, &nines)));
        from += 1;
    }
    let to = if high_full { h } else { h - 1 };
    if from <= to {
        alternatives.push(format!("[{}-{}]{}", from as char, to as char, any(rest)));
    }
    if !high_full {
        let zeros = vec![b'0'; rest];
        alternatives.push(format!("{}{}", h as char, same_length(&zeros, high_rest)));
    }
    format!("(?:{})", alternatives.join("|"))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use regex_automata::meta::Regex;

    use super::*;

    fn full(low: Option<i128>, high: Option<i128>) -> Regex {
        Regex::new(&format!("^{}$", integer_range_regex(low, high).unwrap())).unwrap()
    }

    #[test]
    fn edges_and_forms() {
        let re = full(Some(-5), Some(120));
        for n in -5..=120 {
            assert!(re.is_match(&n.to_string()), "{n}");
        }
        for text in ["-6", "121", "-0", "007", "1000", ""] {
            assert!(!re.is_match(text), "{text}");
        }
        let positive = full(Some(1), None);
        assert!(positive.is_match("1") && positive.is_match("123456789012345678901"));
        assert!(!positive.is_match("0") && !positive.is_match("-1"));
        let negative = full(None, Some(-10));
        assert!(negative.is_match("-10") && negative.is_match("-99999"));
        assert!(!negative.is_match("-9") && !negative.is_match("0"));
        assert!(matches!(
            integer_range_regex(Some(3), Some(2)),
            Err(GrammarError::Unsatisfiable)
        ));
    }

    #[test]
    fn bounds_from_keywords() {
        let bounds = |schema: Value| integer_bounds(schema.as_object().unwrap()).unwrap();
        use serde_json::json;
        assert_eq!(bounds(json!({})), None);
        assert_eq!(
            bounds(json!({"minimum": 1.5, "maximum": 9})),
            Some((Some(2), Some(9)))
        );
        assert_eq!(
            bounds(json!({"exclusiveMinimum": 0, "exclusiveMaximum": 10})),
            Some((Some(1), Some(9)))
        );
        assert_eq!(
            bounds(json!({"minimum": 0, "exclusiveMinimum": true})),
            Some((Some(1), None))
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// The regex accepts a number's decimal form exactly when the
        /// number is in range.
        #[test]
        fn matches_exactly_the_range(
            low in prop::option::of(-100_000i128..100_000),
            span in 0i128..200_000,
            bounded in any::<bool>(),
            probes in prop::collection::vec(-300_000i128..300_000, 40),
        ) {
            let high = if bounded { Some(low.unwrap_or(-50_000) + span) } else { None };
            let re = full(low, high);
            for n in probes.into_iter().chain(low).chain(high) {
                let inside = low.is_none_or(|l| n >= l) && high.is_none_or(|h| n <= h);
                prop_assert_eq!(re.is_match(&n.to_string()), inside, "{} in {:?}..={:?}", n, low, high);
            }
        }
    }
}
