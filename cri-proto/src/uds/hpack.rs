//! A walker over HPACK header blocks (RFC 7541) that mirrors the client's dynamic table and
//! replaces an `:authority` value that h2 would refuse with a valid one of the same length.
//!
//! Keeping the length keeps every dynamic-table entry the same size, so the server's decoder
//! evicts exactly what the client's encoder expects and later indexed references (which may
//! point at the replaced entry) stay in step. Every other byte of the block is kept.

use super::huffman;

/// Bytes an entry costs beyond its name and value (RFC 7541, section 4.1).
const ENTRY_OVERHEAD: usize = 32;
/// The dynamic table's initial size (SETTINGS_HEADER_TABLE_SIZE's default).
const DEFAULT_TABLE_SIZE: usize = 4096;
/// Largest table size a client may ask for here: far above what h2 advertises (4096), which
/// refuses more itself.
const MAX_TABLE_SIZE: usize = 1 << 16;
/// Largest integer accepted (no header block comes near it).
const MAX_INT: usize = 1 << 24;
/// `:authority` is static-table index 1.
const AUTHORITY: &[u8] = b":authority";

/// Name lengths of the static table, indices 1..=61 (RFC 7541, Appendix A).
const STATIC_NAME_LENS: [u8; 61] = [
    10, 7, 7, 5, 5, 7, 7, 7, 7, 7, 7, 7, 7, 14, 15, 15, 15, 6, 13, 27, 3, 5, 13, 13, 19, 16, 16,
    16, 14, 16, 13, 12, 6, 4, 4, 6, 7, 4, 4, 8, 17, 13, 8, 19, 13, 4, 8, 12, 18, 19, 5, 7, 7, 11,
    6, 10, 25, 4, 4, 16, 16,
];

/// The block is not valid HPACK; the server's own decoder will refuse it too.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Malformed;

/// The client encoder's dynamic table, as far as the walker needs it, newest first.
#[derive(Debug)]
pub(super) struct Table {
    entries: std::collections::VecDeque<Entry>,
    size: usize,
    max: usize,
}

/// One dynamic-table entry: whether its name is `:authority`, its name's length, its size.
#[derive(Debug, Clone, Copy)]
struct Entry {
    authority: bool,
    name_len: usize,
    size: usize,
}

impl Default for Table {
    fn default() -> Self {
        Table {
            entries: Default::default(),
            size: 0,
            max: DEFAULT_TABLE_SIZE,
        }
    }
}

impl Table {
    fn evict_to(&mut self, limit: usize) {
        while self.size > limit {
            let Some(e) = self.entries.pop_back() else {
                break;
            };
            self.size -= e.size;
        }
    }

    /// Adds an entry (section 4.4): an entry larger than the table empties it.
    fn insert(&mut self, e: Entry) {
        if e.size > self.max {
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max - e.size);
        self.entries.push_front(e);
        self.size += e.size;
    }

    /// (is `:authority`, name length) of a name index.
    fn name(&self, index: usize) -> Result<(bool, usize), Malformed> {
        match index {
            0 => Err(Malformed),
            1..=61 => Ok((index == 1, STATIC_NAME_LENS[index - 1] as usize)),
            _ => self
                .entries
                .get(index - 62)
                .map(|e| (e.authority, e.name_len))
                .ok_or(Malformed),
        }
    }

    /// Walks one complete header block. Returns the block with each refused `:authority`
    /// value replaced, or `None` when nothing needed replacing.
    pub(super) fn rewrite(&mut self, block: &[u8]) -> Result<Option<Vec<u8>>, Malformed> {
        let mut out: Option<Vec<u8>> = None;
        let mut copied = 0;
        let mut pos = 0;
        while pos < block.len() {
            let b = block[pos];
            if b & 0x80 != 0 {
                let (index, next) = int(block, pos, 7)?;
                if index == 0 || (index > 61 && index - 62 >= self.entries.len()) {
                    return Err(Malformed);
                }
                pos = next;
            } else if b & 0xe0 == 0x20 {
                let (max, next) = int(block, pos, 5)?;
                if max > MAX_TABLE_SIZE {
                    return Err(Malformed);
                }
                self.max = max;
                self.evict_to(max);
                pos = next;
            } else {
                let indexing = b & 0xc0 == 0x40;
                let field = self.field(block, pos, if indexing { 6 } else { 4 })?;
                if field.authority && !valid_authority(&field.value) && !field.value.is_empty() {
                    let o = out.get_or_insert_with(Vec::new);
                    o.extend_from_slice(&block[copied..field.value_at]);
                    put_raw_string(o, &replacement(field.value.len()));
                    copied = field.end;
                }
                if indexing {
                    self.insert(Entry {
                        authority: field.authority,
                        name_len: field.name_len,
                        size: field.name_len + field.value.len() + ENTRY_OVERHEAD,
                    });
                }
                pos = field.end;
            }
        }
        Ok(out.map(|mut o| {
            o.extend_from_slice(&block[copied..]);
            o
        }))
    }

    /// Reads a literal field whose representation starts at `pos`.
    fn field(&self, block: &[u8], pos: usize, prefix: u8) -> Result<Field, Malformed> {
        let (index, mut next) = int(block, pos, prefix)?;
        let (authority, name_len) = if index == 0 {
            let (name, after) = string(block, next)?;
            next = after;
            (name == AUTHORITY, name.len())
        } else {
            self.name(index)?
        };
        let (value, end) = string(block, next)?;
        Ok(Field {
            authority,
            name_len,
            value,
            value_at: next,
            end,
        })
    }
}

struct Field {
    authority: bool,
    name_len: usize,
    value: Vec<u8>,
    /// Where the value's string literal starts in the block.
    value_at: usize,
    end: usize,
}

/// What h2's server accepts as `:authority` (it parses the value as an `http` authority).
fn valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// A valid authority of exactly `len` bytes: `localhost`, cut or padded with `-`.
pub(super) fn replacement(len: usize) -> Vec<u8> {
    b"localhost"
        .iter()
        .copied()
        .chain(std::iter::repeat(b'-'))
        .take(len)
        .collect()
}

/// An HPACK integer with an `n`-bit prefix starting at `pos` (section 5.1).
fn int(block: &[u8], pos: usize, n: u8) -> Result<(usize, usize), Malformed> {
    let mask = (1usize << n) - 1;
    let mut value = usize::from(block[pos]) & mask;
    let mut pos = pos + 1;
    if value < mask {
        return Ok((value, pos));
    }
    let mut shift = 0;
    loop {
        let b = *block.get(pos).ok_or(Malformed)?;
        pos += 1;
        value += usize::from(b & 0x7f) << shift;
        if value > MAX_INT {
            return Err(Malformed);
        }
        if b & 0x80 == 0 {
            return Ok((value, pos));
        }
        shift += 7;
    }
}

/// A string literal at `pos` (section 5.2), decoded, and the position after it.
fn string(block: &[u8], pos: usize) -> Result<(Vec<u8>, usize), Malformed> {
    let huffman = *block.get(pos).ok_or(Malformed)? & 0x80 != 0;
    let (len, start) = int(block, pos, 7)?;
    let end = start
        .checked_add(len)
        .filter(|&e| e <= block.len())
        .ok_or(Malformed)?;
    let raw = &block[start..end];
    let value = if huffman {
        huffman::decode(raw).ok_or(Malformed)?
    } else {
        raw.to_vec()
    };
    Ok((value, end))
}

/// Appends `s` as a string literal without Huffman coding.
fn put_raw_string(out: &mut Vec<u8>, s: &[u8]) {
    put_int(out, 0x00, 7, s.len());
    out.extend_from_slice(s);
}

/// Appends an integer with an `n`-bit prefix; `high` holds the first byte's other bits.
pub(super) fn put_int(out: &mut Vec<u8>, high: u8, n: u8, mut value: usize) {
    let mask = (1usize << n) - 1;
    if value < mask {
        out.push(high | value as u8);
        return;
    }
    out.push(high | mask as u8);
    value -= mask;
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}
