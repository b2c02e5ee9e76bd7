//! JSON-schema string `format`s as regular expressions over the string body
//! (the text between the quotes of the JSON string).
//!
//! Every format here uses only printable ASCII characters that JSON writes
//! without escapes, so the body regex is the format's own syntax; the
//! grammar generates the unescaped spelling (never `\/` for `/`). Where a
//! standard allows variants, the regex may take a documented subset: an
//! output is always valid, not every valid spelling can be generated.
//!
//! - `date`: RFC 3339 `full-date`, `YYYY-MM-DD`, month 01–12, day 01–31
//!   (the day is not checked against the month: `2024-02-31` passes).
//! - `time`: RFC 3339 `full-time`, `HH:MM:SS` (hour 00–23, minute 00–59,
//!   second 00–60 for a leap second), an optional fraction `.` + digits,
//!   and an offset `Z` or `±HH:MM`. Upper-case `Z` only.
//! - `date-time`: `date` + `T` + `time` (upper-case `T` only).
//! - `uuid`: RFC 4122 text, 8-4-4-4-12 hexadecimal digits (either case;
//!   version and variant bits are not checked).
//! - `ipv4`: dotted quad, each part 0–255 in decimal without leading zeros.
//! - `email`: a simple form, `local@domain`: the local part is RFC 5322
//!   `dot-atom` (atoms of letters, digits and ``!#$%&'*+/=?^_`{|}~-`` joined
//!   by single dots); the domain is two or more labels joined by dots, each
//!   label letters, digits and inner hyphens (label lengths not checked).
//!   No quoted local parts, no address literals.
//! - `uri`: an RFC 3986 `URI`: scheme `:` hierarchical part (`//` authority
//!   with optional user info and port, then an absolute-or-empty path; or a
//!   rootless, absolute or empty path), optional `?query` and `#fragment`,
//!   percent-escapes `%HH`. The one simplification: an IP literal in the
//!   authority (`[...]`) is checked only to hold hexadecimal digits, `:`
//!   and `.` (IPv6 syntax itself is not checked; `IPvFuture` is not
//!   generated).
//!
//! Other formats are ignored, like any keyword the schema module does not
//! know (see the module docs of `grammar`).

/// The body regex of a supported `format`, or `None` for an unknown one.
pub(crate) fn format_regex(format: &str) -> Option<String> {
    Some(match format {
        "date" => DATE.to_owned(),
        "time" => time(),
        "date-time" => format!("{DATE}T{}", time()),
        "uuid" => {
            let hex = |n: usize| format!("[0-9a-fA-F]{{{n}}}");
            format!("{}-{}-{}-{}-{}", hex(8), hex(4), hex(4), hex(4), hex(12))
        }
        "ipv4" => format!(r"{OCTET}\.{OCTET}\.{OCTET}\.{OCTET}"),
        "email" => email(),
        "uri" => uri(),
        _ => return None,
    })
}

const DATE: &str = r"[0-9]{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12][0-9]|3[01])";

const OCTET: &str = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";

fn time() -> String {
    let hour = "(?:[01][0-9]|2[0-3])";
    let minute = "[0-5][0-9]";
    format!(r"{hour}:{minute}:(?:[0-5][0-9]|60)(?:\.[0-9]+)?(?:Z|[+-]{hour}:{minute})")
}

fn email() -> String {
    let atom = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~\-]+";
    let label = "[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?";
    format!(r"{atom}(?:\.{atom})*@{label}(?:\.{label})+")
}

fn uri() -> String {
    let unreserved = r"A-Za-z0-9\-._~";
    let sub_delims = r"!$&'()*+,;=";
    let pct = "%[0-9A-Fa-f]{2}";
    let pchar = format!("(?:[{unreserved}{sub_delims}:@]|{pct})");
    let scheme = r"[A-Za-z][A-Za-z0-9+.\-]*";
    let userinfo = format!("(?:[{unreserved}{sub_delims}:]|{pct})*@");
    let reg_name = format!("(?:[{unreserved}{sub_delims}]|{pct})*");
    let ip_literal = r"\[[0-9A-Fa-f:.]+\]";
    let authority = format!("(?:{userinfo})?(?:{ip_literal}|{reg_name})(?::[0-9]*)?");
    let segment = format!("{pchar}*");
    let segment_nz = format!("{pchar}+");
    let path_abempty = format!("(?:/{segment})*");
    let path_absolute = format!("/(?:{segment_nz}(?:/{segment})*)?");
    let path_rootless = format!("{segment_nz}(?:/{segment})*");
    let hier = format!("(?://{authority}{path_abempty}|{path_absolute}|{path_rootless}|)");
    let tail = format!("(?:{pchar}|[/?])*");
    format!(r"{scheme}:{hier}(?:\?{tail})?(?:#{tail})?")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use regex_automata::meta::Regex;

    use crate::grammar::schema_regex;

    /// The whole-document regex of `{"type": "string", "format": format}`.
    fn document(format: &str) -> Regex {
        let schema = serde_json::json!({"type": "string", "format": format});
        Regex::new(&format!("^(?:{})$", schema_regex(&schema).unwrap())).unwrap()
    }

    fn accepts(format: &str, body: &str) -> bool {
        document(format).is_match(&serde_json::Value::String(body.to_owned()).to_string())
    }

    fn date() -> impl Strategy<Value = String> {
        (0u32..=9999, 1u32..=12, 1u32..=31).prop_map(|(y, m, d)| format!("{y:04}-{m:02}-{d:02}"))
    }

    fn time() -> impl Strategy<Value = String> {
        let fraction = proptest::option::of("[0-9]{1,9}");
        let offset = prop_oneof![
            Just("Z".to_owned()),
            (prop_oneof![Just('+'), Just('-')], 0u32..=23, 0u32..=59)
                .prop_map(|(sign, h, m)| format!("{sign}{h:02}:{m:02}")),
        ];
        (0u32..=23, 0u32..=59, 0u32..=60, fraction, offset).prop_map(|(h, m, s, f, o)| {
            let f = f.map(|f| format!(".{f}")).unwrap_or_default();
            format!("{h:02}:{m:02}:{s:02}{f}{o}")
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn valid_values_are_accepted(
            date in date(),
            time in time(),
            uuid in "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
            ip in proptest::array::uniform4(0u8..=255),
            local in "[a-z0-9_+%-]{1,8}(\\.[a-z0-9'{}~]{1,5}){0,2}",
            domain in "[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?(\\.[a-z]{2,6}){1,3}",
            path in "(/[a-zA-Z0-9._~!$&'()*+,;=:@-]{0,6}){0,3}",
            query in proptest::option::of("[a-z0-9=&/?]{0,8}"),
            port in proptest::option::of(0u16..),
        ) {
            prop_assert!(accepts("date", &date));
            prop_assert!(accepts("time", &time));
            let date_time = format!("{date}T{time}");
            prop_assert!(accepts("date-time", &date_time));
            prop_assert!(accepts("uuid", &uuid));
            let [a, b, c, d] = ip;
            let ipv4 = format!("{a}.{b}.{c}.{d}");
            prop_assert!(accepts("ipv4", &ipv4));
            let email = format!("{local}@{domain}");
            prop_assert!(accepts("email", &email), "{}", email);
            let port = port.map(|p| format!(":{p}")).unwrap_or_default();
            let query = query.map(|q| format!("?{q}")).unwrap_or_default();
            let uri = format!("https://user%20x@{domain}{port}{path}{query}#top");
            prop_assert!(accepts("uri", &uri), "{}", uri);
            let urn = format!("urn:isbn{path}");
            prop_assert!(accepts("uri", &urn));
        }

        #[test]
        fn month_and_day_out_of_range_are_rejected(
            year in 0u32..=9999,
            month in 13u32..=99,
            day in 32u32..=99,
        ) {
            let bad = [
                format!("{year:04}-{month:02}-01"),
                format!("{year:04}-01-{day:02}"),
                format!("{year:04}-00-01"),
                format!("{year:04}-01-00"),
            ];
            for bad in bad {
                prop_assert!(!accepts("date", &bad), "{}", bad);
            }
        }

        #[test]
        fn a_mutated_uuid_is_rejected(
            uuid in "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            at in 0usize..36,
            with in "[g-z_ ]",
        ) {
            let mut bad = uuid.clone();
            bad.replace_range(at..at + 1, &with);
            prop_assert!(accepts("uuid", &uuid));
            prop_assert!(!accepts("uuid", &bad), "{}", bad);
            prop_assert!(!accepts("uuid", &uuid[1..]));
        }
    }

    #[test]
    fn obvious_invalid_values_are_rejected() {
        for (format, body) in [
            ("date", "2024-1-01"),
            ("date", "2024-13-01"),
            ("date", "24-01-01"),
            ("date", "2024-01-01T00:00:00Z"),
            ("time", "24:00:00Z"),
            ("time", "12:60:00Z"),
            ("time", "12:00:00"),
            ("time", "12:00:00+1:00"),
            ("date-time", "2024-01-01 12:00:00Z"),
            ("date-time", "2024-01-01T12:00Z"),
            ("uuid", "123e4567-e89b-12d3-a456-42661417400"),
            ("uuid", "123e4567e89b12d3a456426614174000"),
            ("ipv4", "256.1.1.1"),
            ("ipv4", "01.1.1.1"),
            ("ipv4", "1.1.1"),
            ("email", "plain"),
            ("email", "a@localhost"),
            ("email", "a..b@example.com"),
            ("email", "a@-example.com"),
            ("email", "a b@example.com"),
            ("uri", "no scheme"),
            ("uri", "//example.com/path"),
            ("uri", "1http://example.com"),
            ("uri", "http://exa mple.com"),
            ("uri", "http://example.com/%zz"),
            ("uri", "http://example.com:80a/"),
        ] {
            assert!(!accepts(format, body), "{format} accepts {body:?}");
        }
        for (format, body) in [
            ("date-time", "1985-04-12T23:20:50.52Z"),
            ("date-time", "1996-12-19T16:39:57-08:00"),
            ("time", "23:59:60Z"),
            ("uuid", "123E4567-e89b-12d3-a456-426614174000"),
            ("ipv4", "0.0.0.0"),
            ("email", "first.last+tag@mail.example.co"),
            ("uri", "http://[2001:db8::7]:8080/a?b#c"),
            ("uri", "mailto:John.Doe@example.com"),
            ("uri", "file:///etc/hosts"),
        ] {
            assert!(accepts(format, body), "{format} rejects {body:?}");
        }
    }

    #[test]
    fn unknown_formats_are_ignored() {
        assert!(format_regex("hostname").is_none());
        assert!(accepts("hostname", "anything at all"));
    }
}
