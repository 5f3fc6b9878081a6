//! HPACK's Huffman code (RFC 7541, Appendix B): decoding only.
//!
//! The code is canonical, so the bit length of each symbol's code is enough to rebuild every
//! code: symbols ordered by (length, symbol) take consecutive codes.

use std::collections::HashMap;
use std::sync::OnceLock;

/// Code length in bits of symbols 0..=255 and of EOS (256), RFC 7541 Appendix B.
const LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
];

const EOS: u16 = 256;

/// The code of every symbol, indexed by symbol.
pub(super) fn codes() -> &'static [(u32, u8); 257] {
    static CODES: OnceLock<[(u32, u8); 257]> = OnceLock::new();
    CODES.get_or_init(|| {
        let mut order: Vec<u16> = (0..257).collect();
        order.sort_by_key(|&s| (LENGTHS[s as usize], s));
        let mut out = [(0u32, 0u8); 257];
        let mut code = 0u32;
        let mut prev = LENGTHS[order[0] as usize];
        for (i, &s) in order.iter().enumerate() {
            let len = LENGTHS[s as usize];
            if i > 0 {
                code = (code + 1) << (len - prev);
            }
            prev = len;
            out[s as usize] = (code, len);
        }
        out
    })
}

fn decode_map() -> &'static HashMap<(u8, u32), u16> {
    static MAP: OnceLock<HashMap<(u8, u32), u16>> = OnceLock::new();
    MAP.get_or_init(|| {
        codes()
            .iter()
            .enumerate()
            .map(|(s, &(code, len))| ((len, code), s as u16))
            .collect()
    })
}

/// Decodes a Huffman-coded string; `None` when it is not valid HPACK (EOS inside, a code
/// that never ends, padding longer than 7 bits or not all ones).
pub(super) fn decode(src: &[u8]) -> Option<Vec<u8>> {
    let map = decode_map();
    let mut out = Vec::with_capacity(src.len() * 8 / 5);
    let (mut code, mut len) = (0u32, 0u8);
    for byte in src {
        for shift in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> shift) & 1);
            len += 1;
            if len > 30 {
                return None;
            }
            if let Some(&sym) = map.get(&(len, code)) {
                if sym == EOS {
                    return None;
                }
                out.push(sym as u8);
                (code, len) = (0, 0);
            }
        }
    }
    // What is left is padding: the most significant bits of EOS, i.e. all ones.
    (len < 8 && code == (1u32 << len) - 1).then_some(out)
}

/// Encodes `src` (tests build client header blocks with it).
#[cfg(test)]
pub(super) fn encode(src: &[u8]) -> Vec<u8> {
    let (mut acc, mut bits, mut out) = (0u64, 0u32, Vec::new());
    for &b in src {
        let (code, len) = codes()[b as usize];
        acc = (acc << len) | u64::from(code);
        bits += u32::from(len);
        while bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    if bits > 0 {
        let pad = 8 - bits;
        out.push(((acc << pad) | ((1 << pad) - 1)) as u8);
    }
    out
}
