//! Byte-level BPE over token ids: a word starts as one symbol per byte and the adjacent pair
//! with the lowest merge rank is merged, leftmost first among equal ranks, until no listed
//! merge applies (the rule shared by the GPT-2 reference, Hugging Face and llama.cpp).

use crate::hash::FastMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The merge table: `(left id, right id)` -> `(rank, merged id)`.
#[derive(Debug, Clone, Default)]
pub struct Merges {
    table: FastMap<u64, (u32, u32)>,
}

#[inline]
fn key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

impl Merges {
    /// An empty table sized for `n` merges.
    pub fn with_capacity(n: usize) -> Self {
        Merges {
            table: FastMap::with_capacity_and_hasher(n, Default::default()),
        }
    }

    /// Adds a merge; the first rule for a pair wins, as in the reference implementations.
    pub fn insert(&mut self, left: u32, right: u32, rank: u32, merged: u32) {
        self.table.entry(key(left, right)).or_insert((rank, merged));
    }

    /// Number of usable merges.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    #[inline]
    fn get(&self, left: u32, right: u32) -> Option<(u32, u32)> {
        self.table.get(&key(left, right)).copied()
    }
}

#[derive(Clone, Copy)]
struct Sym {
    id: u32,
    prev: u32,
    next: u32,
}

const NONE: u32 = u32::MAX;

/// Reusable buffers for [`encode_word`], so encoding allocates nothing per word.
#[derive(Default)]
pub struct Scratch {
    syms: Vec<Sym>,
    heap: BinaryHeap<Reverse<(u32, u32, u32, u32)>>,
}

/// `byte_ids` entry of a byte the vocabulary has no symbol for (some real vocabularies
/// lack a few control bytes): it takes part in no merge and is left out of the output,
/// as llama.cpp leaves it out, so that such a file still loads and runs.
pub const NO_BYTE_TOKEN: u32 = u32::MAX;

/// Appends the BPE ids of one word to `out`; `byte_ids[b]` is the token of byte `b`
/// (or [`NO_BYTE_TOKEN`]).
pub fn encode_word(
    merges: &Merges,
    byte_ids: &[u32; 256],
    word: &[u8],
    scratch: &mut Scratch,
    out: &mut Vec<u32>,
) {
    match word.len() {
        0 => return,
        1 => {
            out.extend(Some(byte_ids[word[0] as usize]).filter(|&id| id != NO_BYTE_TOKEN));
            return;
        }
        _ => {}
    }
    let syms = &mut scratch.syms;
    let heap = &mut scratch.heap;
    syms.clear();
    heap.clear();
    let n = word.len() as u32;
    for (i, &b) in word.iter().enumerate() {
        let i = i as u32;
        syms.push(Sym {
            id: byte_ids[b as usize],
            prev: if i == 0 { NONE } else { i - 1 },
            next: if i + 1 == n { NONE } else { i + 1 },
        });
    }
    // Heap entries: (rank, left position, left id, right id); ids detect stale entries.
    let push = |heap: &mut BinaryHeap<_>, syms: &[Sym], left: u32| {
        if left == NONE {
            return;
        }
        let right = syms[left as usize].next;
        if right == NONE {
            return;
        }
        let (l, r) = (syms[left as usize].id, syms[right as usize].id);
        if let Some((rank, _)) = merges.get(l, r) {
            heap.push(Reverse((rank, left, l, r)));
        }
    };
    for i in 0..n - 1 {
        push(heap, syms, i);
    }
    while let Some(Reverse((_, left, l, r))) = heap.pop() {
        let ls = syms[left as usize];
        if ls.id != l || ls.next == NONE || syms[ls.next as usize].id != r {
            continue;
        }
        // A symbol merged away keeps a stale id but is unreachable: `next` links skip it.
        let Some((_, merged)) = merges.get(l, r) else {
            continue;
        };
        let right = ls.next;
        let after = syms[right as usize].next;
        syms[left as usize].id = merged;
        syms[left as usize].next = after;
        if after != NONE {
            syms[after as usize].prev = left;
        }
        // Invalidate the removed symbol so stale heap entries that point at it fail.
        syms[right as usize].id = NONE;
        push(heap, syms, syms[left as usize].prev);
        push(heap, syms, left);
    }
    let mut i = 0u32;
    while i != NONE {
        let id = syms[i as usize].id;
        if id != NO_BYTE_TOKEN {
            out.push(id);
        }
        i = syms[i as usize].next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Byte ids are the byte values; merges get ids from 256 up.
    fn setup(rules: &[(u32, u32)]) -> (Merges, [u32; 256]) {
        let mut m = Merges::with_capacity(rules.len());
        for (rank, &(l, r)) in rules.iter().enumerate() {
            m.insert(l, r, rank as u32, 256 + rank as u32);
        }
        let mut ids = [0u32; 256];
        for (b, id) in ids.iter_mut().enumerate() {
            *id = b as u32;
        }
        (m, ids)
    }

    fn enc(m: &Merges, ids: &[u32; 256], w: &[u8]) -> Vec<u32> {
        let mut out = Vec::new();
        encode_word(m, ids, w, &mut Scratch::default(), &mut out);
        out
    }

    #[test]
    fn lowest_rank_first_then_leftmost() {
        let a = u32::from(b'a');
        let b = u32::from(b'b');
        // rank 0: a+a -> 256; rank 1: 256+b -> 257
        let (m, ids) = setup(&[(a, a), (256, b)]);
        assert_eq!(enc(&m, &ids, b"aaa"), vec![256, a]);
        assert_eq!(enc(&m, &ids, b"aab"), vec![257]);
        assert_eq!(enc(&m, &ids, b"aaaa"), vec![256, 256]);
        assert_eq!(enc(&m, &ids, b"baab"), vec![b, 257]);
        assert_eq!(enc(&m, &ids, b"x"), vec![u32::from(b'x')]);
        assert!(enc(&m, &ids, b"").is_empty());
    }

    #[test]
    fn rank_beats_position() {
        let (x, y, z) = (u32::from(b'x'), u32::from(b'y'), u32::from(b'z'));
        // y+z has the better rank, so "xyz" becomes x + (yz), not (xy) + z.
        let (m, ids) = setup(&[(y, z), (x, y)]);
        assert_eq!(enc(&m, &ids, b"xyz"), vec![x, 256]);
    }
}
