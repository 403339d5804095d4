//! The matrix file as text, before and while it becomes YAML: its size, its
//! encoding, its documents, its indentation, how far its aliases expand, and
//! where its comments are (a field is never located inside one). Also the one
//! place that turns the YAML crate's errors into ours.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::MatrixError;

/// The largest matrix file accepted: 1 MiB.
pub const MAX_BYTES: usize = 1 << 20;

/// The most YAML values (scalars, sequences and mappings) a matrix may hold
/// with its aliases expanded. A matrix of the reference study holds about
/// 100; a file of 1 MiB without aliases fewer than 300,000.
pub const MAX_VALUES: usize = 1_000_000;

/// Nesting deeper than this is refused (the YAML crate's own limit).
const MAX_DEPTH: usize = 128;

fn error(file: &str, line: Option<usize>, message: String) -> MatrixError {
    MatrixError { file: file.to_owned(), line, field: String::new(), message }
}

fn check_size(file: &str, len: usize) -> Result<(), MatrixError> {
    if len > MAX_BYTES {
        return Err(error(
            file,
            None,
            format!("is {len} bytes; a matrix file may be at most {MAX_BYTES} bytes (1 MiB)"),
        ));
    }
    Ok(())
}

/// The text of a matrix file read as bytes: at most [`MAX_BYTES`], UTF-8; a
/// byte-order mark is dropped.
pub fn decode<'a>(file: &str, bytes: &'a [u8]) -> Result<&'a str, MatrixError> {
    check_size(file, bytes.len())?;
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    std::str::from_utf8(bytes).map_err(|e| {
        let at = e.valid_up_to();
        let before = &bytes[..at];
        let line_start = before.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1);
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        // The prefix is valid UTF-8: count its characters for the column.
        let column = std::str::from_utf8(&before[line_start..]).map_or(at - line_start, |s| s.chars().count()) + 1;
        error(
            file,
            Some(line),
            format!(
                "is not UTF-8: the byte 0x{:02X} at line {line}, column {column} is not part of a UTF-8 character \
                 (save the file as UTF-8)",
                bytes[at]
            ),
        )
    })
}

/// The text with every comment replaced by spaces, so that offsets and
/// lines stay where they were. A `#` begins a comment at the start of a
/// line or after whitespace, outside quotes.
pub fn without_comments(yaml: &str) -> String {
    let mut out = String::with_capacity(yaml.len());
    for line in yaml.split_inclusive('\n') {
        let mut quote: Option<char> = None;
        let mut previous: Option<char> = None;
        let mut cut = None;
        let mut chars = line.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            match quote {
                Some('"') if c == '\\' => {
                    chars.next();
                }
                Some(q) if c == q => {
                    // '' inside single quotes is an escaped quote.
                    if q == '\'' && chars.peek().is_some_and(|&(_, n)| n == '\'') {
                        chars.next();
                    } else {
                        quote = None;
                    }
                }
                Some(_) => {}
                None if c == '#' && previous.is_none_or(char::is_whitespace) => {
                    cut = Some(i);
                    break;
                }
                None if matches!(c, '"' | '\'') && previous.is_none_or(|p| " \t[{,:-".contains(p)) => {
                    quote = Some(c);
                }
                None => {}
            }
            previous = Some(c);
        }
        match cut {
            Some(at) => {
                out.push_str(&line[..at]);
                let comment = &line[at..];
                let end = comment.trim_end_matches(['\n', '\r']);
                out.extend(std::iter::repeat_n(' ', end.len()));
                out.push_str(&comment[end.len()..]);
            }
            None => out.push_str(line),
        }
    }
    out
}

/// Checks made on the text (comments blanked) before it is parsed.
pub fn check(file: &str, plain: &str) -> Result<(), MatrixError> {
    check_size(file, plain.len())?;
    let mut content = false;
    for (n, line) in plain.lines().enumerate() {
        let marker = line.strip_prefix("---").is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']));
        if marker && content {
            return Err(error(
                file,
                Some(n + 1),
                "a second YAML document begins here ('---'); a matrix file is one document".to_owned(),
            ));
        }
        let body = if marker { &line[3..] } else { line };
        if !body.trim().is_empty() && !line.starts_with('%') {
            content = true;
        }
    }
    Ok(())
}

/// Walks the YAML with its aliases expanded, building nothing, and fails
/// once it has seen more than [`MAX_VALUES`] values: an alias bomb is
/// refused after a bounded amount of work, before anything is built of it.
/// Syntax errors come out of here first.
pub fn walk(file: &str, yaml: &str, plain: &str) -> Result<(), MatrixError> {
    let left = Cell::new(MAX_VALUES);
    let de = serde_yaml_ng::Deserializer::from_str(yaml);
    Count { left: &left }.deserialize(de).map_err(|e| from_yaml(file, plain, &e, true))
}

const TOO_MANY: &str = "\u{0}too many values";

struct Count<'a> {
    left: &'a Cell<usize>,
}

impl Count<'_> {
    fn take<E: de::Error>(&self) -> Result<(), E> {
        match self.left.get() {
            0 => Err(E::custom(TOO_MANY)),
            n => {
                self.left.set(n - 1);
                Ok(())
            }
        }
    }
}

impl<'de> DeserializeSeed<'de> for Count<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Count<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("plain YAML values (no tags)")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.take()
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.take()
    }
    fn visit_i128<E: de::Error>(self, _: i128) -> Result<(), E> {
        self.take()
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.take()
    }
    fn visit_u128<E: de::Error>(self, _: u128) -> Result<(), E> {
        self.take()
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.take()
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.take()
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.take()
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.take()
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.take()?;
        while seq.next_element_seed(Count { left: self.left })?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.take()?;
        while map.next_key_seed(Count { left: self.left })?.is_some() {
            map.next_value_seed(Count { left: self.left })?;
        }
        Ok(())
    }
}

/// Our error for one of the YAML crate's. `syntax`: it came from the first
/// reading of the text, where every error but a few is one of YAML syntax.
pub fn from_yaml(file: &str, plain: &str, e: &serde_yaml_ng::Error, syntax: bool) -> MatrixError {
    let text = e.to_string();
    let at = e.location().map(|l| (l.line(), l.column()));
    let line = at.map(|(l, _)| l);
    // The crate appends " at line L column C"; we say where ourselves.
    let (head, context) = match text.split_once(" at line ") {
        Some((head, rest)) => (head.to_owned(), rest.split_once(", ").map(|(_, c)| c.to_owned())),
        None => (text.clone(), None),
    };
    if head.contains(TOO_MANY) {
        return error(
            file,
            first_alias_line(plain),
            format!(
                "expands to more than {MAX_VALUES} values through its aliases (*name); \
                 a matrix this large is an alias bomb or a mistake"
            ),
        );
    }
    if head == "repetition limit exceeded" {
        return error(
            file,
            first_alias_line(plain),
            "repeats its aliases (*name) too often; a matrix this large is an alias bomb or a mistake".to_owned(),
        );
    }
    if head == "recursion limit exceeded" {
        return error(file, line, format!("is nested more than {MAX_DEPTH} levels deep"));
    }
    if head.starts_with("deserializing from YAML containing more than one document") {
        return error(file, None, "holds more than one YAML document; a matrix file is one document".to_owned());
    }
    if head == "unknown anchor" {
        return error(file, line, "an alias (*name) refers to an anchor (&name) defined nowhere before it".to_owned());
    }
    // Found while reading the text, or (with the mapping's path) while
    // reading it into the matrix's shape.
    const DUPLICATE: &str = "duplicate entry with key ";
    let duplicate = head.strip_prefix(DUPLICATE).map(|key| ("", key)).or_else(|| {
        let (path, rest) = head.split_once(": ")?;
        Some((path, rest.strip_prefix(DUPLICATE)?)).filter(|_| !path.contains(' '))
    });
    if let Some((path, key)) = duplicate {
        // The parser places a duplicate key at its mapping's start; point
        // at the key's second appearance instead.
        let key = key.trim_matches('"');
        return MatrixError {
            file: file.to_owned(),
            line: super::second_key_line(plain, key, at).or(line),
            field: path.to_owned(),
            message: format!("the key '{key}' appears twice in one mapping"),
        };
    }
    if syntax && !head.contains(TOO_MANY) && !head.starts_with("invalid type") {
        if let Some((l, c)) = tab_in_indentation(plain) {
            return error(
                file,
                Some(l),
                format!("a tab in the indentation at line {l}, column {c}; YAML indents with spaces only"),
            );
        }
        let (l, c) = at.unwrap_or((1, 1));
        let context = context.map(|c| format!(" ({c})")).unwrap_or_default();
        return error(file, Some(l), format!("YAML syntax error at line {l}, column {c}: {head}{context}"));
    }
    let (field, message) = match head.split_once(": ") {
        Some((path, rest)) if !path.contains(' ') => (path.to_owned(), rest.to_owned()),
        _ => (String::new(), head),
    };
    MatrixError { file: file.to_owned(), line, field, message }
}

/// The first line (and column, from 1) whose indentation holds a tab.
fn tab_in_indentation(plain: &str) -> Option<(usize, usize)> {
    plain.lines().enumerate().find_map(|(n, line)| {
        let indent = line.len() - line.trim_start_matches([' ', '\t']).len();
        let rest = line[indent..].trim();
        line[..indent].find('\t').filter(|_| !rest.is_empty()).map(|c| (n + 1, c + 1))
    })
}

fn first_alias_line(plain: &str) -> Option<usize> {
    plain.lines().position(|line| line.contains(" *") || line.contains("[*") || line.contains(",*")).map(|n| n + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_are_blanked_in_place() {
        let yaml = "a: 1 # one\n# all\nb: 'x # y' # z\nc: \"q\\\" # r\"\nd: x#y\n";
        let plain = without_comments(yaml);
        assert_eq!(plain.len(), yaml.len());
        assert_eq!(plain, "a: 1      \n     \nb: 'x # y'    \nc: \"q\\\" # r\"\nd: x#y\n");
    }

    #[test]
    fn bad_bytes_are_located() {
        let e = decode("m.yaml", b"name: x\nmodel: \"m\xc3\xa9\xff\"\n").expect_err("refused");
        assert_eq!(e.line, Some(2));
        assert!(e.message.contains("byte 0xFF at line 2, column 11"), "{e}");
        assert_eq!(decode("m.yaml", b"\xEF\xBB\xBFname: x\n").expect("decoded"), "name: x\n");
    }

    #[test]
    fn a_second_document_is_located() {
        assert!(check("m", "---\nname: x\n").is_ok());
        assert!(check("m", "%YAML 1.2\n---\nname: x\n").is_ok());
        assert_eq!(check("m", "name: x\n\n--- \nname: y\n").expect_err("refused").line, Some(3));
        assert!(check("m", "a: |\n  ----\n").is_ok());
    }

    #[test]
    fn an_alias_bomb_is_refused_after_bounded_work() {
        let mut yaml = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..10 {
            let p = i - 1;
            yaml.push_str(&format!(
                "l{i}: &l{i} [*{}, *{0}, *{0}, *{0}, *{0}, *{0}, *{0}, *{0}, *{0}, *{0}]\n",
                if p == 0 { "a".to_owned() } else { format!("l{p}") }
            ));
        }
        let e = walk("m", &yaml, &yaml).expect_err("refused");
        assert!(e.message.contains("alias"), "{e}");
        assert_eq!(e.line, Some(2));
    }

    #[test]
    fn deep_nesting_is_refused() {
        let yaml = format!("a: {}{}\n", "[".repeat(200), "]".repeat(200));
        let e = walk("m", &yaml, &yaml).expect_err("refused");
        assert!(e.message.contains("nested more than 128 levels"), "{e}");
    }

    #[test]
    fn syntax_errors_and_tabs_say_what_they_are() {
        let yaml = "name: x\nmodel: [m\n";
        let e = walk("m", yaml, yaml).expect_err("refused");
        assert!(e.message.starts_with("YAML syntax error at line 3, column 1: "), "{e}");
        let yaml = "name: x\nengines:\n\tvllm: {}\n";
        let e = walk("m", yaml, yaml).expect_err("refused");
        assert_eq!(e.line, Some(3));
        assert!(e.message.contains("a tab in the indentation at line 3, column 1"), "{e}");
    }
}
