//! Host lists as operators write them (`--hosts`): comma-separated names
//! with `*` and `?` wildcards and Slurm's numeric ranges (`gpu[01-16,20]`),
//! a leading `!` leaving hosts out: `gpu[01-64],!gpu07`, `h200-*`,
//! `!rack3-*`. Only exclusions: every host but those.

use std::fmt;

/// A parsed host list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostList {
    text: String,
    include: Vec<Vec<Token>>,
    exclude: Vec<Vec<Token>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Char(char),
    /// `*`: any run of characters, none included.
    Any,
    /// `?`: one character.
    One,
    /// `[01-16,20]`: a number in one of the ranges; a range written with a
    /// leading zero matches only numbers of its width (`01`..`16`), one
    /// without matches them unpadded (`1`..`16`).
    Range(Vec<Span>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    lo: u64,
    hi: u64,
    /// The digits each number has, when padded; 0: unpadded.
    width: usize,
}

impl HostList {
    /// Parses `text`; the error says which term is wrong and why.
    pub fn parse(text: &str) -> Result<HostList, String> {
        let mut list = HostList { text: text.trim().to_owned(), include: Vec::new(), exclude: Vec::new() };
        for term in terms(text)? {
            let term = term.trim();
            let (negated, pattern) = match term.strip_prefix('!') {
                Some(rest) => (true, rest.trim()),
                None => (false, term),
            };
            if pattern.is_empty() {
                return Err(format!("host list '{}': an empty name (two commas, or a lone '!')", list.text));
            }
            let tokens = tokens(pattern).map_err(|why| format!("host list '{}': '{term}': {why}", list.text))?;
            if negated { list.exclude.push(tokens) } else { list.include.push(tokens) }
        }
        Ok(list)
    }

    /// Whether the host `name` is on the list.
    pub fn matches(&self, name: &str) -> bool {
        let chars: Vec<char> = name.chars().collect();
        let hit = |p: &Vec<Token>| matches(p, &chars);
        (self.include.is_empty() || self.include.iter().any(hit)) && !self.exclude.iter().any(hit)
    }
}

impl fmt::Display for HostList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// The list split at the commas outside brackets.
fn terms(text: &str) -> Result<Vec<&str>, String> {
    if text.trim().is_empty() {
        return Err("an empty host list".to_owned());
    }
    let (mut out, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in text.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(format!("host list '{text}': a '[' inside brackets")),
            ']' if depth == 0 => return Err(format!("host list '{text}': a ']' without its '['")),
            ']' => depth = 0,
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth > 0 {
        return Err(format!("host list '{text}': a '[' is not closed"));
    }
    out.push(&text[start..]);
    Ok(out)
}

fn tokens(pattern: &str) -> Result<Vec<Token>, String> {
    let mut out = Vec::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        out.push(match c {
            '*' => Token::Any,
            '?' => Token::One,
            '[' => {
                let inner: String = chars.by_ref().take_while(|c| *c != ']').collect();
                Token::Range(inner.split(',').map(span).collect::<Result<_, _>>()?)
            }
            c if c.is_whitespace() => return Err("a host name has no spaces".to_owned()),
            c => Token::Char(c),
        });
    }
    Ok(out)
}

/// `01-16`, `7` or `20-31`.
fn span(item: &str) -> Result<Span, String> {
    let item = item.trim();
    let (lo, hi) = item.split_once('-').unwrap_or((item, item));
    let number = |s: &str| -> Result<u64, String> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("'[{item}]': a range is numbers, as in [01-16,20]"));
        }
        s.parse().map_err(|_| format!("'{s}' is too large a number"))
    };
    let (l, h) = (number(lo)?, number(hi)?);
    if l > h {
        return Err(format!("'[{item}]': the range runs backwards"));
    }
    let padded = lo.len() > 1 && lo.starts_with('0');
    Ok(Span { lo: l, hi: h, width: if padded { lo.len() } else { 0 } })
}

fn matches(p: &[Token], s: &[char]) -> bool {
    let Some((first, rest)) = p.split_first() else { return s.is_empty() };
    match first {
        Token::Char(c) => s.first() == Some(c) && matches(rest, &s[1..]),
        Token::One => !s.is_empty() && matches(rest, &s[1..]),
        Token::Any => (0..=s.len()).any(|n| matches(rest, &s[n..])),
        Token::Range(spans) => {
            let digits = s.iter().take_while(|c| c.is_ascii_digit()).count();
            (1..=digits).any(|n| {
                let text: String = s[..n].iter().collect();
                let Ok(value) = text.parse::<u64>() else { return false };
                let fits = |sp: &Span| {
                    let width_ok = if sp.width > 0 { n == sp.width } else { n == 1 || !text.starts_with('0') };
                    width_ok && (sp.lo..=sp.hi).contains(&value)
                };
                spans.iter().any(fits) && matches(rest, &s[n..])
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selected(list: &str, names: &[&str]) -> Vec<String> {
        let l = HostList::parse(list).expect("parses");
        names.iter().filter(|n| l.matches(n)).map(|n| n.to_string()).collect()
    }

    #[test]
    fn names_wildcards_and_ranges_select_and_a_bang_leaves_out() {
        let fleet = ["gpu01", "gpu02", "gpu07", "gpu10", "gpu1", "gpu100", "cpu01", "rack3-a", "rack4-a"];
        assert_eq!(selected("gpu[01-07],!gpu02", &fleet), ["gpu01", "gpu07"]);
        assert_eq!(selected("gpu[1-10]", &fleet), ["gpu10", "gpu1"], "unpadded: gpu01 is not gpu1");
        assert_eq!(selected("gpu[1,100]", &fleet), ["gpu1", "gpu100"]);
        assert_eq!(selected("gpu*", &fleet).len(), 6);
        assert_eq!(selected("gpu0?", &fleet), ["gpu01", "gpu02", "gpu07"]);
        assert_eq!(selected("!rack*,!gpu*", &fleet), ["cpu01"], "only exclusions: everything else");
        assert_eq!(selected("rack[3-4]-a, cpu01", &fleet), ["cpu01", "rack3-a", "rack4-a"]);
        assert_eq!(selected("gpu01", &fleet), ["gpu01"]);
    }

    #[test]
    fn a_bad_list_says_which_term_and_why() {
        let err = |s: &str| HostList::parse(s).expect_err(s);
        assert_eq!(err(""), "an empty host list");
        assert_eq!(err("gpu[01-04"), "host list 'gpu[01-04': a '[' is not closed");
        assert_eq!(err("a,,b"), "host list 'a,,b': an empty name (two commas, or a lone '!')");
        assert_eq!(err("gpu[04-01]"), "host list 'gpu[04-01]': 'gpu[04-01]': '[04-01]': the range runs backwards");
        assert_eq!(err("gpu[a-c]"), "host list 'gpu[a-c]': 'gpu[a-c]': '[a-c]': a range is numbers, as in [01-16,20]");
        assert_eq!(err("gpu]"), "host list 'gpu]': a ']' without its '['");
    }

    proptest::proptest! {
        /// A padded range matches exactly the names it expands to.
        #[test]
        fn a_range_matches_what_it_expands_to(lo in 0u64..50, len in 0u64..50, n in 0u64..120, pad in proptest::bool::ANY) {
            let hi = lo + len;
            let list = if pad { format!("n[{lo:03}-{hi:03}]") } else { format!("n[{lo}-{hi}]") };
            let name = if pad { format!("n{n:03}") } else { format!("n{n}") };
            let l = HostList::parse(&list).expect("parses");
            proptest::prop_assert_eq!(l.matches(&name), (lo..=hi).contains(&n));
        }
    }
}
