//! File names where they leave the kernel as text: for machines (JSON, [`json`]) and for
//! people ([`quoted`]).
//!
//! A Linux file name is bytes: anything but `/` and NUL, not necessarily UTF-8, and it may
//! hold newlines or terminal escape sequences. Code in a sandbox chooses the names lockbox
//! later reports, so both forms must be exact:
//!
//! - **JSON** (change sets, commit reports, transaction records, the WAL intent, branch
//!   meta, `--json` outputs, the HTTP API): a name that is valid UTF-8 is a JSON string; any
//!   other is an object `{"bytes": "<base64>"}` holding its bytes in standard base64 (RFC
//!   4648, with padding). Writers use the string form whenever they can; readers accept both.
//!   The two forms cannot be confused (a string or an object), and every name round-trips.
//! - **People** (`--dry-run`, summaries, `branch show/diff`, `txn list`, error messages): a
//!   name is printed as is, unless it holds a control character (newline, carriage return,
//!   escape, ...), a Unicode bidirectional or line-separator control, a `"`, a `\` or bytes
//!   that are not UTF-8. Then it is printed in double quotes with C escapes, as git's
//!   `core.quotePath` does: `\n \t \r \a \b \f \v \" \\`, and `\ooo` (octal) for each other
//!   byte of such a character or such bytes (`"caf\351.txt"`, `"a\033[1Ab"`). So a name can
//!   never start a new line, move the cursor or recolour the terminal, and a quoted name
//!   cannot be mistaken for a plain one.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A name as people see it (see the module doc): `Display` quotes and escapes it when it
/// holds anything a terminal would act on.
#[derive(Debug, Clone, Copy)]
pub struct Quoted<'a>(&'a [u8]);

/// `name` ready to print for a person: `format!("M {}", quoted(path))`.
pub fn quoted<N: AsRef<OsStr> + ?Sized>(name: &N) -> Quoted<'_> {
    Quoted(name.as_ref().as_bytes())
}

/// Characters a terminal or a text layout acts on instead of showing: C0 and C1 controls
/// and DEL (newline, carriage return, escape, CSI...), and the Unicode controls that reorder
/// or break lines (bidirectional embeddings, overrides and isolates, line and paragraph
/// separators: "Trojan Source", CVE-2021-42574). All of them are in the Basic Multilingual
/// Plane (a JSON `\uXXXX` escape holds each).
pub fn acts_on_terminal(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
        )
}

fn needs_quotes(bytes: &[u8]) -> bool {
    bytes.utf8_chunks().any(|chunk| {
        !chunk.invalid().is_empty()
            || chunk
                .valid()
                .chars()
                .any(|c| c == '"' || c == '\\' || acts_on_terminal(c))
    })
}

fn write_octal(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    bytes.iter().try_for_each(|b| write!(f, "\\{b:03o}"))
}

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !needs_quotes(self.0) {
            // No invalid UTF-8 (else it would need quotes): one valid chunk, or none.
            return self
                .0
                .utf8_chunks()
                .try_for_each(|chunk| f.write_str(chunk.valid()));
        }
        f.write_str("\"")?;
        for chunk in self.0.utf8_chunks() {
            for c in chunk.valid().chars() {
                match c {
                    '"' => f.write_str("\\\"")?,
                    '\\' => f.write_str("\\\\")?,
                    '\x07' => f.write_str("\\a")?,
                    '\x08' => f.write_str("\\b")?,
                    '\t' => f.write_str("\\t")?,
                    '\n' => f.write_str("\\n")?,
                    '\x0b' => f.write_str("\\v")?,
                    '\x0c' => f.write_str("\\f")?,
                    '\r' => f.write_str("\\r")?,
                    c if acts_on_terminal(c) => {
                        write_octal(f, c.encode_utf8(&mut [0; 4]).as_bytes())?
                    }
                    c => fmt::Write::write_char(f, c)?,
                }
            }
            write_octal(f, chunk.invalid())?;
        }
        f.write_str("\"")
    }
}

/// Text that is not a name but is shown to a person next to names (a diff of file contents,
/// a command's stderr): every control character but newline and tab, and every Unicode
/// control that reorders or breaks lines, becomes `\ooo` octal, as in a quoted name. Lines
/// stay lines, and nothing in the text can move the cursor or rewrite earlier output.
pub fn printable_text(text: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char = |c: char| c != '\n' && c != '\t' && acts_on_terminal(c);
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unsafe_char(c) {
            for b in c.encode_utf8(&mut [0; 4]).as_bytes() {
                out.push_str(&format!("\\{b:03o}"));
            }
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Text a sandbox chose (a command line, a DNS name) shown inside a line where lockbox asks
/// a person for a decision (`lockbox run --net-ask`), where a forged line must be
/// impossible: only printable ASCII is kept as is. Every other byte — control characters
/// (C0, DEL), the UTF-8 bytes of C1 controls (CSI U+009B...), of Unicode format characters
/// (bidirectional overrides, zero-width characters...) and of any other non-ASCII character,
/// so no look-alike letter either — becomes `\ooo` octal, and `\` becomes `\\`, as in a
/// quoted name. At most `max` bytes are kept (an escape is never cut), then `...`.
pub fn ascii_line(text: &[u8], max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max) + 3);
    for &b in text {
        let piece = match b {
            b'\\' => "\\\\".to_owned(),
            0x20..=0x7e => char::from(b).to_string(),
            _ => format!("\\{b:03o}"),
        };
        if out.len() + piece.len() > max {
            out.push_str("...");
            break;
        }
        out.push_str(&piece);
    }
    out
}

/// The JSON form of a path (see the module doc) as a serialisable value:
/// `serde_json::json!({ "path": Encoded(p) })`. Serialising it never fails.
#[derive(Debug, Clone, Copy)]
pub struct Encoded<'a>(pub &'a Path);

impl Serialize for Encoded<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.to_str() {
            Some(text) => s.serialize_str(text),
            None => {
                let mut map = s.serialize_map(Some(1))?;
                let b64 =
                    base64::engine::general_purpose::STANDARD.encode(self.0.as_os_str().as_bytes());
                map.serialize_entry("bytes", &b64)?;
                map.end()
            }
        }
    }
}

/// A path read from its JSON form (either form).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded(pub PathBuf);

impl<'de> Deserialize<'de> for Decoded {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DecodedVisitor)
    }
}

struct DecodedVisitor;

impl<'de> Visitor<'de> for DecodedVisitor {
    type Value = Decoded;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(r#"a path: a string, or {"bytes": "<base64>"} for a name that is not UTF-8"#)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Decoded, E> {
        Ok(Decoded(PathBuf::from(v)))
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Decoded, E> {
        Ok(Decoded(PathBuf::from(OsStr::from_bytes(v))))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Decoded, A::Error> {
        let mut bytes: Option<String> = None;
        while let Some(key) = map.next_key::<String>()? {
            if key != "bytes" || bytes.is_some() {
                return Err(de::Error::custom(format!(
                    "a path object has exactly one field, \"bytes\" (found {key:?})"
                )));
            }
            bytes = Some(map.next_value()?);
        }
        let b64 = bytes.ok_or_else(|| de::Error::missing_field("bytes"))?;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map_err(|e| de::Error::custom(format!("path \"bytes\": not base64: {e}")))?;
        Ok(Decoded(PathBuf::from(OsString::from_vec(raw))))
    }
}

/// The schema of the JSON form, which [`Decoded`] reads and [`Encoded`] writes: component
/// `Name` of lockbox-server's OpenAPI document (a `PathBuf` field with
/// `#[serde(with = "lockbox_policy::name::json")]` takes `#[schema(value_type = Decoded)]`).
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for Decoded {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{
            KnownFormat, ObjectBuilder, OneOfBuilder, SchemaFormat, Type,
        };
        let text = ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("The name as text."));
        let bytes = ObjectBuilder::new()
            .schema_type(Type::Object)
            .title(Some("NameBytes"))
            .description(Some("A name that is not UTF-8: its bytes, base64."))
            .property(
                "bytes",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .format(Some(SchemaFormat::KnownFormat(KnownFormat::Byte)))
                    .description(Some("The bytes, base64 (standard alphabet, padded).")),
            )
            .required("bytes");
        OneOfBuilder::new()
            .item(text)
            .item(bytes)
            .description(Some(
                "A file name (`lockbox_policy::name`): a string when it is UTF-8, else its bytes.",
            ))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for Decoded {
    fn name() -> std::borrow::Cow<'static, str> {
        "Name".into()
    }
}

/// `#[serde(with = "lockbox_policy::name::json")]` on a `PathBuf` field: the lossless JSON
/// form of the module doc (serde's own form fails on a name that is not UTF-8). Submodules
/// for `Vec<PathBuf>`, `Option<PathBuf>` and `Option<Vec<PathBuf>>`.
pub mod json {
    use super::{Decoded, Encoded};
    use serde::{Deserialize, Deserializer, Serializer};
    use std::path::{Path, PathBuf};

    /// Serialises one path.
    pub fn serialize<P: AsRef<Path>, S: Serializer>(p: &P, s: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(&Encoded(p.as_ref()), s)
    }

    /// Deserialises one path (either form).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
        Decoded::deserialize(d).map(|p| p.0)
    }

    /// For `Vec<PathBuf>`.
    pub mod vec {
        use super::{Decoded, Encoded};
        use serde::{Deserialize, Deserializer, Serializer};
        use std::path::PathBuf;

        /// Serialises a list of paths.
        pub fn serialize<S: Serializer>(v: &[PathBuf], s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(v.iter().map(|p| Encoded(p)))
        }

        /// Deserialises a list of paths.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PathBuf>, D::Error> {
            Vec::<Decoded>::deserialize(d).map(|v| v.into_iter().map(|p| p.0).collect())
        }
    }

    /// For `Option<PathBuf>`.
    pub mod option {
        use super::{Decoded, Encoded};
        use serde::{Deserialize, Deserializer, Serializer};
        use std::path::PathBuf;

        /// Serialises an optional path (`null` for none).
        pub fn serialize<S: Serializer>(v: &Option<PathBuf>, s: S) -> Result<S::Ok, S::Error> {
            match v {
                Some(p) => s.serialize_some(&Encoded(p)),
                None => s.serialize_none(),
            }
        }

        /// Deserialises an optional path.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
            Option::<Decoded>::deserialize(d).map(|v| v.map(|p| p.0))
        }
    }

    /// For `Option<Vec<PathBuf>>`.
    pub mod option_vec {
        use super::{Decoded, Encoded};
        use serde::{Deserialize, Deserializer, Serialize, Serializer};
        use std::path::PathBuf;

        struct List<'a>(&'a [PathBuf]);

        impl Serialize for List<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.iter().map(|p| Encoded(p)))
            }
        }

        /// Serialises an optional list of paths (`null` for none).
        pub fn serialize<S: Serializer>(v: &Option<Vec<PathBuf>>, s: S) -> Result<S::Ok, S::Error> {
            match v {
                Some(list) => s.serialize_some(&List(list)),
                None => s.serialize_none(),
            }
        }

        /// Deserialises an optional list of paths.
        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Vec<PathBuf>>, D::Error> {
            Option::<Vec<Decoded>>::deserialize(d)
                .map(|v| v.map(|list| list.into_iter().map(|p| p.0).collect()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn q(bytes: &[u8]) -> String {
        quoted(OsStr::from_bytes(bytes)).to_string()
    }

    #[test]
    fn plain_names_print_as_they_are() {
        assert_eq!(q(b"src/main.rs"), "src/main.rs");
        assert_eq!(q("café/naïve 名前.txt".as_bytes()), "café/naïve 名前.txt");
        assert_eq!(q(b"a b'c"), "a b'c");
        assert_eq!(q(b""), "");
    }

    #[test]
    fn names_a_terminal_would_act_on_are_quoted_with_c_escapes() {
        assert_eq!(q(b"a\nM b.txt"), r#""a\nM b.txt""#);
        assert_eq!(q(b"x\rD y"), r#""x\rD y""#);
        assert_eq!(q(b"\x1b[1A\x1b[2Kz"), r#""\033[1A\033[2Kz""#);
        assert_eq!(q(b"caf\xe9.txt"), r#""caf\351.txt""#);
        assert_eq!(q(b"t\tv\x0bf\x0cb\x08a\x07"), r#""t\tv\vf\fb\ba\a""#);
        assert_eq!(q(b"q\"b\\"), r#""q\"b\\""#);
        assert_eq!(q(b"del\x7f"), r#""del\177""#);
        // C1 CSI (U+009B) and a right-to-left override (U+202E), as their UTF-8 bytes.
        assert_eq!(q("c1\u{9b}2J".as_bytes()), r#""c1\302\2332J""#);
        assert_eq!(
            q("rlo\u{202e}txt.exe".as_bytes()),
            r#""rlo\342\200\256txt.exe""#
        );
    }

    #[test]
    fn ascii_lines_keep_printable_ascii_and_escape_every_other_byte() {
        assert_eq!(
            ascii_line(b"pip install requests", 60),
            "pip install requests"
        );
        assert_eq!(
            ascii_line(b"\r\x1b[2Kallow pip? \x1b]0;x\x07", 60),
            r"\015\033[2Kallow pip? \033]0;x\007"
        );
        assert_eq!(ascii_line("c1\u{9b}2J".as_bytes(), 60), r"c1\302\2332J");
        assert_eq!(
            ascii_line("a\u{202e}b\u{200b}".as_bytes(), 60),
            r"a\342\200\256b\342\200\213"
        );
        assert_eq!(
            ascii_line(b"del\x7f back\\slash", 60),
            r"del\177 back\\slash"
        );
        assert_eq!(ascii_line(b"abcdef", 4), "abcd...");
        // An escape is kept whole or not at all.
        assert_eq!(ascii_line(b"abc\x1b", 5), "abc...");
    }

    #[test]
    fn printable_text_keeps_lines_and_tabs_and_escapes_the_rest() {
        assert_eq!(printable_text("a\tb\nc\n"), "a\tb\nc\n");
        assert_eq!(printable_text("x\r\x1b[2Ky\n"), "x\\015\\033[2Ky\n");
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Holder {
        #[serde(with = "json")]
        one: PathBuf,
        #[serde(with = "json::vec")]
        many: Vec<PathBuf>,
        #[serde(with = "json::option", default)]
        maybe: Option<PathBuf>,
        #[serde(with = "json::option_vec", default)]
        some: Option<Vec<PathBuf>>,
    }

    fn path(bytes: &[u8]) -> PathBuf {
        PathBuf::from(OsStr::from_bytes(bytes))
    }

    #[test]
    fn json_form_is_a_string_for_utf8_and_base64_bytes_otherwise() {
        let h = Holder {
            one: path(b"caf\xe9.txt"),
            many: vec![path(b"a/b"), path(b"\xff")],
            maybe: Some(path("é".as_bytes())),
            some: None,
        };
        let v = serde_json::to_value(&h).unwrap_or_default();
        assert_eq!(
            v,
            serde_json::json!({
                "one": {"bytes": "Y2Fm6S50eHQ="},
                "many": ["a/b", {"bytes": "/w=="}],
                "maybe": "é",
                "some": null,
            })
        );
        let back: Holder = serde_json::from_value(v).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, h);
    }

    #[test]
    fn bad_json_forms_are_refused() {
        for bad in [
            r#"{"one": {"bytes": "***"}, "many": []}"#,
            r#"{"one": {"b": "YQ=="}, "many": []}"#,
            r#"{"one": {}, "many": []}"#,
            r#"{"one": 3, "many": []}"#,
        ] {
            assert!(serde_json::from_str::<Holder>(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn every_name_round_trips_through_json(
            names in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..5)
        ) {
            let many: Vec<PathBuf> = names.iter().map(|n| path(n)).collect();
            let h = Holder { one: path(names.concat().as_slice()), many, maybe: None, some: Some(vec![]) };
            let text = serde_json::to_string(&h).unwrap_or_default();
            let back: Holder = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            prop_assert_eq!(back, h);
        }

        #[test]
        fn an_ascii_line_is_printable_ascii_only_and_bounded(
            text in proptest::collection::vec(any::<u8>(), 0..200),
            max in 0usize..120,
        ) {
            let line = ascii_line(&text, max);
            prop_assert!(line.bytes().all(|b| (0x20..=0x7e).contains(&b)), "{line:?}");
            prop_assert!(line.len() <= max + 3, "{line:?}");
            if text.len() <= max && text.iter().all(|b| (0x20..=0x7e).contains(b) && *b != b'\\') {
                prop_assert_eq!(line.as_bytes(), &text[..]);
            }
        }

        #[test]
        fn a_quoted_name_is_one_line_without_escape_bytes(name in proptest::collection::vec(any::<u8>(), 0..40)) {
            let shown = q(&name);
            prop_assert!(!shown.chars().any(acts_on_terminal), "{:?}", shown);
            // Unquoted output is exactly the name.
            if !shown.starts_with('"') {
                prop_assert_eq!(shown.as_bytes(), name.as_slice());
            }
        }
    }
}
