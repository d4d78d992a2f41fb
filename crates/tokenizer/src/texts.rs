//! Token texts in one arena with an open-addressing index, so loading a 150k-token
//! vocabulary costs two allocations instead of two per token.

use crate::hash::FastHasher;
use std::hash::Hasher;

/// All token texts, addressable by id and by text.
#[derive(Debug, Clone, Default)]
pub struct TextTable {
    arena: String,
    /// `offsets[i]..offsets[i + 1]` is token i's text in `arena`.
    offsets: Vec<u32>,
    /// Open-addressing slots holding `id + 1`; 0 marks an empty slot.
    slots: Vec<u32>,
}

fn hash(s: &str) -> usize {
    let mut h = FastHasher::default();
    h.write(s.as_bytes());
    // The low bits index the table: fold the well-mixed high bits down.
    let v = h.finish();
    (v ^ (v >> 29)) as usize
}

impl TextTable {
    /// Builds the table; `None` if the texts exceed 4 GiB in total.
    pub fn new<'a>(texts: impl ExactSizeIterator<Item = &'a str>) -> Option<Self> {
        let n = texts.len();
        let mut t = TextTable {
            arena: String::with_capacity(n * 8),
            offsets: Vec::with_capacity(n + 1),
            slots: vec![0; (2 * n).next_power_of_two().max(8)],
        };
        t.offsets.push(0);
        for (i, s) in texts.enumerate() {
            t.arena.push_str(s);
            t.offsets.push(u32::try_from(t.arena.len()).ok()?);
            t.index(i as u32);
        }
        Some(t)
    }

    /// Number of texts.
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Text of `id`; `None` outside the table.
    pub fn text(&self, id: u32) -> Option<&str> {
        let i = id as usize;
        let (s, e) = (*self.offsets.get(i)?, *self.offsets.get(i + 1)?);
        Some(&self.arena[s as usize..e as usize])
    }

    /// Id of `text`; with duplicate texts the last id wins (as in llama.cpp).
    pub fn id(&self, text: &str) -> Option<u32> {
        let mask = self.slots.len() - 1;
        let mut i = hash(text) & mask;
        loop {
            let slot = self.slots[i];
            if slot == 0 {
                return None;
            }
            if self.text(slot - 1) == Some(text) {
                return Some(slot - 1);
            }
            i = (i + 1) & mask;
        }
    }

    fn index(&mut self, id: u32) {
        let mask = self.slots.len() - 1;
        let (s, e) = (
            self.offsets[id as usize] as usize,
            self.offsets[id as usize + 1] as usize,
        );
        let mut i = hash(&self.arena[s..e]) & mask;
        loop {
            let slot = self.slots[i];
            if slot == 0 || self.text(slot - 1) == Some(&self.arena[s..e]) {
                self.slots[i] = id + 1;
                return;
            }
            i = (i + 1) & mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_both_ways() {
        let words = ["a", "b", "ab", "", "Ġthe", "b"];
        let t = TextTable::new(words.iter().copied()).unwrap();
        assert_eq!(t.len(), 6);
        assert_eq!(t.text(2), Some("ab"));
        assert_eq!(t.text(6), None);
        assert_eq!(t.id("ab"), Some(2));
        assert_eq!(t.id("Ġthe"), Some(4));
        assert_eq!(t.id("b"), Some(5), "last duplicate wins");
        assert_eq!(t.id(""), Some(3));
        assert_eq!(t.id("zz"), None);
    }
}
