//! The prompt cache shared across slots (and across the models a server holds): KV rows
//! of sequences that ran, kept in host RAM in blocks of a fixed number of positions, so
//! that a slot whose prompt starts with cached blocks copies their rows instead of
//! prefilling them (llama-server's `--cache-ram`, vLLM's automatic prefix caching).
//!
//! A block's key is the SHA-256 of its parent's key (the engine's KV fingerprint for the
//! first block) and its tokens: equal keys mean the same tokens at the same positions
//! after the same prefix, run by an engine whose rows are the same bits (same model,
//! hyperparameters, KV formats and backends, see `session::kv_fingerprint`). The rows
//! are stored exactly as the engine holds them, so a prompt served from the cache
//! continues bit for bit as one prefilled.
//!
//! The cache holds at most its budget of row bytes; a block that does not fit pushes out
//! the least recently used ones. A chain is touched deepest block first, so its first
//! blocks, which every longer prompt needs, are the last of it to go.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

/// A block's identity: its tokens, the tokens before it, and the engine's fingerprint.
pub type BlockKey = [u8; 32];

/// One block's rows, shared with the importer while the cache may drop it.
pub type BlockRows = Arc<[u32]>;

/// The cache, shared by every model's worker.
pub type SharedPromptCache = Arc<Mutex<PromptCache>>;

struct Entry {
    rows: BlockRows,
    tick: u64,
}

/// KV rows of token blocks, least recently used first out, within a byte budget.
pub struct PromptCache {
    budget: usize,
    block: usize,
    used: usize,
    clock: u64,
    entries: HashMap<BlockKey, Entry>,
    /// Entries by last use (tick to key), oldest first.
    order: BTreeMap<u64, BlockKey>,
}

impl PromptCache {
    /// An empty cache of at most `budget` bytes of rows, in blocks of `block` positions;
    /// a zero budget or block size turns it off.
    pub fn new(budget: usize, block: usize) -> Self {
        PromptCache {
            budget,
            block,
            used: 0,
            clock: 0,
            entries: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    /// Whether the cache can hold anything.
    pub fn enabled(&self) -> bool {
        self.budget > 0 && self.block > 0
    }

    /// Positions per block.
    pub fn block(&self) -> usize {
        self.block
    }

    /// Bytes of rows held (never more than the budget).
    pub fn bytes(&self) -> usize {
        self.used
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no block is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The keys of the full blocks of `tokens` (a trailing partial block has none), for
    /// an engine of `fingerprint`.
    pub fn keys(&self, fingerprint: &[u8; 32], tokens: &[u32]) -> Vec<BlockKey> {
        if self.block == 0 {
            return Vec::new();
        }
        let mut parent = *fingerprint;
        tokens
            .chunks_exact(self.block)
            .map(|chunk| {
                let mut h = Sha256::new();
                h.update(parent);
                for t in chunk {
                    h.update(t.to_le_bytes());
                }
                parent = h.finalize().into();
                parent
            })
            .collect()
    }

    /// Whether the block of `key` is held (its use is not recorded).
    pub fn contains(&self, key: &BlockKey) -> bool {
        self.entries.contains_key(key)
    }

    /// The rows of the longest run of held blocks from the first of `keys`, which are
    /// marked used.
    pub fn lookup(&mut self, keys: &[BlockKey]) -> Vec<BlockRows> {
        let hits: Vec<BlockRows> = keys
            .iter()
            .map_while(|k| self.entries.get(k).map(|e| Arc::clone(&e.rows)))
            .collect();
        self.touch(&keys[..hits.len()]);
        hits
    }

    /// Marks the held blocks of a chain used, deepest first (its first blocks become the
    /// most recently used).
    pub fn touch(&mut self, chain: &[BlockKey]) {
        for k in chain.iter().rev() {
            self.clock += 1;
            if let Some(e) = self.entries.get_mut(k) {
                self.order.remove(&e.tick);
                e.tick = self.clock;
                self.order.insert(self.clock, *k);
            }
        }
    }

    /// Stores the rows of block `key` of `chain`, pushing out the least recently used
    /// blocks of other chains as needed. Returns false (and stores nothing) when the
    /// block does not fit without dropping a block of `chain`: a block is of use only
    /// after its parents.
    pub fn insert(&mut self, key: BlockKey, rows: Vec<u32>, chain: &[BlockKey]) -> bool {
        if self.entries.contains_key(&key) {
            return true;
        }
        let size = rows.len() * 4;
        if size > self.budget {
            return false;
        }
        while self.used + size > self.budget {
            let victim = self
                .order
                .iter()
                .find(|(_, k)| !chain.contains(k))
                .map(|(&t, &k)| (t, k));
            let Some((tick, k)) = victim else {
                return false;
            };
            self.order.remove(&tick);
            if let Some(e) = self.entries.remove(&k) {
                self.used -= e.rows.len() * 4;
            }
        }
        self.clock += 1;
        self.used += size;
        self.order.insert(self.clock, key);
        self.entries.insert(
            key,
            Entry {
                rows: rows.into(),
                tick: self.clock,
            },
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FP: [u8; 32] = [7; 32];

    fn rows(n: usize, fill: u32) -> Vec<u32> {
        vec![fill; n]
    }

    #[test]
    fn keys_chain_the_blocks_and_depend_on_the_fingerprint_and_every_token() {
        let c = PromptCache::new(1 << 20, 4);
        let a: Vec<u32> = (0..10).collect();
        let k = c.keys(&FP, &a);
        assert_eq!(k.len(), 2, "a partial block has no key");
        let mut b = a.clone();
        b[1] = 99;
        let kb = c.keys(&FP, &b);
        assert_ne!(k[0], kb[0]);
        assert_ne!(k[1], kb[1], "a block's key depends on the tokens before it");
        assert_ne!(k, c.keys(&[8; 32], &a), "another engine's rows");
        assert_eq!(k, c.keys(&FP, &a[..8]));
    }

    #[test]
    fn lookup_returns_the_longest_held_run_from_the_first_block() {
        let mut c = PromptCache::new(1 << 20, 2);
        let keys = c.keys(&FP, &[1, 2, 3, 4, 5, 6]);
        assert!(c.insert(keys[0], rows(8, 1), &keys));
        assert!(c.insert(keys[2], rows(8, 3), &keys));
        let hit = c.lookup(&keys);
        assert_eq!(hit.len(), 1, "the third block is no use without the second");
        assert_eq!(&hit[0][..], &rows(8, 1)[..]);
        assert!(c.insert(keys[1], rows(8, 2), &keys));
        assert_eq!(c.lookup(&keys).len(), 3);
        assert!(c.lookup(&c.keys(&[9; 32], &[1, 2, 3, 4])).is_empty());
    }

    #[test]
    fn the_budget_holds_and_the_least_recently_used_chain_goes_first() {
        // Three blocks of 16 bytes fit.
        let mut c = PromptCache::new(48, 2);
        let a = c.keys(&FP, &[1, 1, 1, 1]);
        let b = c.keys(&FP, &[2, 2]);
        for k in &a {
            assert!(c.insert(*k, rows(4, 0), &a));
        }
        c.touch(&a);
        assert!(c.insert(b[0], rows(4, 0), &b));
        assert_eq!(c.bytes(), 48);
        // Chain `a` is used again: `b` is now the oldest and goes.
        assert_eq!(c.lookup(&a).len(), 2);
        let d = c.keys(&FP, &[3, 3]);
        assert!(c.insert(d[0], rows(4, 0), &d));
        assert!(!c.contains(&b[0]) && c.contains(&a[0]) && c.contains(&a[1]));
        assert_eq!(c.bytes(), 48);
        // Within one chain, the deeper block goes before its parent.
        let e = c.keys(&FP, &[4, 4]);
        assert!(c.insert(e[0], rows(4, 0), &e));
        assert!(
            c.contains(&a[0]) && !c.contains(&a[1]),
            "the leaf goes first"
        );
        assert!(c.bytes() <= 48);
        // A block larger than the budget is refused and changes nothing.
        let f = c.keys(&FP, &[5, 5]);
        assert!(!c.insert(f[0], rows(13, 0), &f));
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn a_chain_never_pushes_out_its_own_parents() {
        let mut c = PromptCache::new(32, 1);
        let k = c.keys(&FP, &[1, 2, 3]);
        assert!(c.insert(k[0], rows(4, 0), &k));
        assert!(c.insert(k[1], rows(4, 0), &k));
        assert!(!c.insert(k[2], rows(4, 0), &k));
        assert_eq!(c.lookup(&k).len(), 2);
    }
}
