//! Go's `filepath.Match` (on Linux) for one host label of a docker config key, as upstream's
//! `URLsMatch` applies it: `*` (any run, never crossing `/`), `?` (one character), `[...]`
//! classes (`^` negates, `a-z` ranges, `\` escapes inside), `\` escapes; a malformed pattern
//! (Go's `ErrBadPattern`) matches nothing.
//!
//! The pattern is checked once and cut into chunks, each a run of single-character tokens
//! after a run of stars. A chunk after a star is placed at the first position where it
//! matches and is never moved again (the last one must also end the text), as Go does, so a
//! match costs at most |pattern| x |text| steps whatever the stars: a key of 2,000 stars is
//! one star.

/// A pattern that is not a glob (Go's `ErrBadPattern`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("syntax error in pattern")]
pub struct BadPattern;

/// Go's path separator: `*` and `?` never match it.
const SEPARATOR: u8 = b'/';

/// One single-character token of a chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// One byte as it is (escaped or plain).
    Byte(u8),
    /// `?`: one character, not the separator.
    Any,
    /// `[...]`: one character in (or, negated, outside) the inclusive ranges.
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

/// Stars (any number, one or more counts as one) followed by single-character tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Chunk {
    star: bool,
    tokens: Vec<Token>,
}

/// A checked pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    chunks: Vec<Chunk>,
    /// The pattern, when it has no special character: a match is an equality.
    literal: Option<String>,
}

/// One character of a class (after `[`, `^` or `-`): an escaped or plain character; the
/// class must go on after it.
fn class_char(p: &[char], i: &mut usize) -> Result<char, BadPattern> {
    let mut c = *p.get(*i).ok_or(BadPattern)?;
    if c == '-' || c == ']' {
        return Err(BadPattern);
    }
    if c == '\\' {
        *i += 1;
        c = *p.get(*i).ok_or(BadPattern)?;
    }
    *i += 1;
    if *i >= p.len() {
        return Err(BadPattern);
    }
    Ok(c)
}

/// A class starting after its `[`; `i` ends after its `]`.
fn class(p: &[char], i: &mut usize) -> Result<Token, BadPattern> {
    let negated = p.get(*i) == Some(&'^');
    if negated {
        *i += 1;
    }
    let mut ranges = Vec::new();
    loop {
        if p.get(*i) == Some(&']') && !ranges.is_empty() {
            *i += 1;
            return Ok(Token::Class { negated, ranges });
        }
        let lo = class_char(p, i)?;
        let mut hi = lo;
        if p[*i] == '-' {
            *i += 1;
            hi = class_char(p, i)?;
        }
        ranges.push((lo, hi));
    }
}

impl Glob {
    /// Checks `pattern` and cuts it into chunks.
    pub fn new(pattern: &str) -> Result<Glob, BadPattern> {
        if !pattern.contains(['*', '?', '[', '\\']) {
            return Ok(Glob {
                chunks: Vec::new(),
                literal: Some(pattern.to_string()),
            });
        }
        let p: Vec<char> = pattern.chars().collect();
        let mut chunks: Vec<Chunk> = Vec::new();
        let mut i = 0;
        while i < p.len() {
            let mut star = false;
            while p.get(i) == Some(&'*') {
                star = true;
                i += 1;
            }
            let mut tokens = Vec::new();
            while let Some(&c) = p.get(i).filter(|c| **c != '*') {
                i += 1;
                match c {
                    '?' => tokens.push(Token::Any),
                    '[' => tokens.push(class(&p, &mut i)?),
                    '\\' => {
                        let e = *p.get(i).ok_or(BadPattern)?;
                        i += 1;
                        let mut buf = [0; 4];
                        tokens.extend(e.encode_utf8(&mut buf).bytes().map(Token::Byte));
                    }
                    c => {
                        let mut buf = [0; 4];
                        tokens.extend(c.encode_utf8(&mut buf).bytes().map(Token::Byte));
                    }
                }
            }
            chunks.push(Chunk { star, tokens });
        }
        Ok(Glob {
            chunks,
            literal: None,
        })
    }

    /// Whether the whole of `text` matches.
    pub fn matches(&self, text: &str) -> bool {
        if let Some(l) = &self.literal {
            return l == text;
        }
        let mut rest = text.as_bytes();
        let last = self.chunks.len().saturating_sub(1);
        for (n, chunk) in self.chunks.iter().enumerate() {
            let is_last = n == last;
            if chunk.star && chunk.tokens.is_empty() {
                // A trailing star: the rest, unless it holds a separator.
                return !rest.contains(&SEPARATOR);
            }
            // Where the chunk may start: here, then (after a star) one byte further each
            // time, never past a separator; the first place that fits is kept.
            let fits =
                |at| match_chunk(&chunk.tokens, at).filter(|r: &&[u8]| !is_last || r.is_empty());
            let mut placed = fits(rest);
            if placed.is_none() && chunk.star {
                let mut skip = 0;
                while placed.is_none() && skip < rest.len() && rest[skip] != SEPARATOR {
                    skip += 1;
                    placed = fits(&rest[skip..]);
                }
            }
            match placed {
                Some(r) => rest = r,
                None => return false,
            }
        }
        rest.is_empty()
    }
}

/// The first character of `s` as Go decodes it: an invalid byte is U+FFFD of width 1.
fn decode(s: &[u8]) -> (char, usize) {
    let head = &s[..s.len().min(4)];
    let valid = match std::str::from_utf8(head) {
        Ok(v) => v,
        Err(e) => std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or(""),
    };
    match valid.chars().next() {
        Some(c) => (c, c.len_utf8()),
        None => (char::REPLACEMENT_CHARACTER, 1),
    }
}

/// What is left of `s` after `tokens` matched its beginning; None when they do not.
fn match_chunk<'a>(tokens: &[Token], mut s: &'a [u8]) -> Option<&'a [u8]> {
    for t in tokens {
        let &first = s.first()?;
        match t {
            Token::Byte(b) => {
                if first != *b {
                    return None;
                }
                s = &s[1..];
            }
            Token::Any => {
                if first == SEPARATOR {
                    return None;
                }
                s = &s[decode(s).1..];
            }
            Token::Class { negated, ranges } => {
                let (c, n) = decode(s);
                let hit = ranges.iter().any(|(lo, hi)| *lo <= c && c <= *hi);
                if hit == *negated {
                    return None;
                }
                s = &s[n..];
            }
        }
    }
    Some(s)
}

/// Go's `filepath.Match(pattern, text)` with `ErrBadPattern` as no match.
pub fn matches(pattern: &str, text: &str) -> bool {
    Glob::new(pattern).is_ok_and(|g| g.matches(text))
}

#[cfg(test)]
mod tests;
