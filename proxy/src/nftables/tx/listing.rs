//! The `kube-proxy` table as the kernel holds it, read back once at start (`nft list table
//! <family> kube-proxy`), in a form that compares with what the proxier renders.
//!
//! nft prints a rule in its own canonical text, which is not always the text that was
//! written (`mark set mark or 0x4000` comes back as `meta mark set meta mark | 0x00004000`,
//! `{ a }` as `a`, `x , y` as `x, y`). Both sides go through [`canon_rule`], so a rule
//! compares equal when nft would print the two the same way. A rule that still differs only
//! in spelling costs a rewrite of its chain, never a wrong table.
//!
//! The text listing is read rather than `nft -j`: the JSON gives a rule as an expression
//! tree, which could only be compared with the rendered text by compiling that text the
//! way nft does; the text listing is nft's own rendering of the same trees.

use std::collections::BTreeMap;

use super::super::names::TABLE;
use super::super::render::family_word;
use crate::model::IpFamily;

/// The chains and sets (and maps) of one family's `kube-proxy` table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listed {
    /// Chain name → its rules, each through [`canon_rule`].
    pub chains: BTreeMap<String, Vec<String>>,
    /// Set or map name → its declaration and elements.
    pub sets: BTreeMap<String, ListedSet>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListedSet {
    pub decl: SetDecl,
    /// Element key → the whole element (key, comment, verdict) through [`canon_element`].
    pub elements: BTreeMap<String, String>,
}

/// What decides whether an existing set can be kept: its type, flags and timeout (the
/// size nft prints for a dynamic set and the comment are not compared).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetDecl {
    pub ty: String,
    /// Sorted.
    pub flags: Vec<String>,
    pub timeout_secs: Option<u64>,
}

impl SetDecl {
    /// The declaration body the renderer writes: `{ type T ; flags a,b ; timeout 600s ; }`.
    pub fn from_rendered(body: &str) -> SetDecl {
        let inner = body.trim().trim_start_matches('{').trim_end_matches('}');
        let mut d = SetDecl::default();
        for part in inner.split(';') {
            d.take(part.trim());
        }
        d.flags.sort();
        d
    }

    /// One attribute line (`type …`, `flags …`, `timeout …`); others are ignored.
    fn take(&mut self, line: &str) {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        let rest = rest.trim();
        match word {
            "type" => self.ty = collapse(rest),
            "flags" => {
                self.flags = rest
                    .split(',')
                    .map(|f| f.trim().to_string())
                    .filter(|f| !f.is_empty())
                    .collect();
                self.flags.sort();
            }
            "timeout" => self.timeout_secs = parse_nft_time(rest),
            _ => {}
        }
    }
}

/// nft's time syntax (`600s`, `10m`, `1h30m`, `2d`, `500ms`) in whole seconds.
pub fn parse_nft_time(s: &str) -> Option<u64> {
    let mut total_ms: u64 = 0;
    let mut num = String::new();
    let mut chars = s.trim().chars().peekable();
    let mut any = false;
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            num.push(c);
            continue;
        }
        let n: u64 = num.parse().ok()?;
        num.clear();
        let unit_ms = match c {
            'd' => 86_400_000,
            'h' => 3_600_000,
            'm' if chars.peek() == Some(&'s') => {
                chars.next();
                1
            }
            'm' => 60_000,
            's' => 1000,
            _ => return None,
        };
        total_ms = total_ms.checked_add(n.checked_mul(unit_ms)?)?;
        any = true;
    }
    if !num.is_empty() {
        // A bare number is seconds.
        total_ms = total_ms.checked_add(num.parse::<u64>().ok()?.checked_mul(1000)?)?;
        any = true;
    }
    any.then_some(total_ms / 1000)
}

fn collapse(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A rule in a spelling-independent form (see the module's text): whitespace collapsed,
/// no space before a comma, `meta mark` as `mark`, `| ^ &` as `or xor and`, numbers written
/// in hex as decimal, and a one-element anonymous set `{ x }` as `x`.
pub fn canon_rule(rule: &str) -> String {
    let mut toks: Vec<String> = Vec::new();
    let mut words = rule.split_whitespace().peekable();
    while let Some(w) = words.next() {
        if w == "meta" && words.peek() == Some(&"mark") {
            continue;
        }
        let t = match w {
            "|" => "or".to_string(),
            "^" => "xor".to_string(),
            "&" => "and".to_string(),
            _ => match w.strip_prefix("0x").map(|h| u64::from_str_radix(h, 16)) {
                Some(Ok(v)) => v.to_string(),
                _ => w.to_string(),
            },
        };
        toks.push(t);
    }
    let joined = toks.join(" ").replace(" ,", ",");
    unwrap_single_sets(&joined)
}

/// `{ x }` → `x` where x has no `,` and no ` : ` (an anonymous set of one element, which
/// nft prints without braces).
fn unwrap_single_sets(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'{'
            && let Some(len) = s[i + 1..].find('}')
        {
            let inner = &s[i + 1..i + 1 + len];
            if !inner.contains('{') && !inner.contains(',') && !inner.contains(" : ") {
                out.push_str(inner.trim());
                i += len + 2;
                continue;
            }
        }
        let c = s[i..].chars().next().unwrap_or(' ');
        out.push(c);
        i += c.len_utf8();
    }
    collapse(&out)
}

/// An element as compared: whitespace collapsed.
pub fn canon_element(e: &str) -> String {
    collapse(e)
}

/// The key of an element's text: what precedes ` comment "…"`, ` timeout …` or ` : verdict`.
pub fn element_key(e: &str) -> &str {
    let mut end = e.len();
    for sep in [" comment \"", " : ", " timeout ", " expires "] {
        if let Some(p) = e.find(sep) {
            end = end.min(p);
        }
    }
    e[..end].trim()
}

/// Splits `a, b, "c, d"` at the commas outside quotes.
fn split_elements(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(s[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(s[start..].trim());
    out.retain(|e| !e.is_empty());
    out
}

/// Braces opened minus closed outside quotes.
fn brace_balance(s: &str) -> i32 {
    let (mut n, mut quoted) = (0, false);
    for c in s.chars() {
        match c {
            '"' => quoted = !quoted,
            '{' if !quoted => n += 1,
            '}' if !quoted => n -= 1,
            _ => {}
        }
    }
    n
}

enum Block {
    Chain(String),
    Set(String),
}

impl Listed {
    /// The `kube-proxy` table of `family` in `nft list table` (or `nft list ruleset`)
    /// output; `None` when the output holds no such table or does not read as one.
    pub fn parse(family: IpFamily, listing: &str) -> Option<Listed> {
        let header = format!("table {} {TABLE} {{", family_word(family));
        let mut out = Listed::default();
        let mut found = false;
        let mut in_table = false;
        // Depth inside a table that is not ours (skipped).
        let mut other = 0i32;
        let mut block: Option<Block> = None;
        let mut elements: Option<String> = None;
        // Braces still open in `elements` (a set's elements span lines).
        let mut open = 0i32;
        for line in listing.lines() {
            let l = line.trim();
            if l.is_empty() {
                continue;
            }
            if other > 0 {
                other += brace_balance(l);
                continue;
            }
            if !in_table {
                if l == header {
                    in_table = true;
                    found = true;
                } else if l.starts_with("table ") {
                    other = brace_balance(l);
                }
                continue;
            }
            if let Some(acc) = elements.as_mut() {
                acc.push(' ');
                acc.push_str(l);
                open += brace_balance(l);
                if open <= 0 {
                    let text = elements.take().unwrap_or_default();
                    let inner = text
                        .trim()
                        .trim_start_matches("elements = {")
                        .trim_end_matches('}');
                    if let Some(Block::Set(name)) = &block {
                        let set = out.sets.entry(name.clone()).or_default();
                        for e in split_elements(inner) {
                            set.elements
                                .insert(element_key(e).to_string(), canon_element(e));
                        }
                    }
                }
                continue;
            }
            match &block {
                None => {
                    if l == "}" {
                        in_table = false;
                        continue;
                    }
                    let mut w = l.split_whitespace();
                    match (w.next(), w.next(), w.next(), w.next()) {
                        (Some("chain"), Some(name), Some("{"), None) => {
                            out.chains.insert(name.to_string(), Vec::new());
                            block = Some(Block::Chain(name.to_string()));
                        }
                        (Some("set" | "map"), Some(name), Some("{"), None) => {
                            out.sets.insert(name.to_string(), ListedSet::default());
                            block = Some(Block::Set(name.to_string()));
                        }
                        (Some("comment" | "flags"), ..) => {}
                        // Flowtables, counters, …: not what this table holds.
                        _ => return None,
                    }
                }
                Some(Block::Chain(name)) => {
                    if l == "}" {
                        block = None;
                    } else if l.starts_with("type ") || l.starts_with("comment \"") {
                        // The chain's declaration (hook, priority, policy) or comment.
                    } else if let Some(rules) = out.chains.get_mut(name) {
                        rules.push(canon_rule(l));
                    }
                }
                Some(Block::Set(name)) => {
                    if l == "}" {
                        block = None;
                    } else if l.starts_with("elements = {") {
                        if brace_balance(l) <= 0 {
                            let inner = l.trim_start_matches("elements = {").trim_end_matches('}');
                            let set = out.sets.entry(name.clone()).or_default();
                            for e in split_elements(inner) {
                                set.elements
                                    .insert(element_key(e).to_string(), canon_element(e));
                            }
                        } else {
                            open = brace_balance(l);
                            elements = Some(l.to_string());
                        }
                    } else if let Some(set) = out.sets.get_mut(name) {
                        set.decl.take(l);
                    }
                }
            }
        }
        (found && !in_table && block.is_none() && elements.is_none()).then_some(out)
    }
}
