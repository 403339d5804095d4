//! The KV cache as blocks of [`BLOCK_TOKENS`] tokens, with vLLM's automatic prefix caching.
//!
//! A sequence holds two kinds of blocks: *anonymous* ones (a prompt being
//! computed, a partial last block, reply tokens whose tokens the caller did not
//! name) and *hashed* ones: full blocks, the prompt's and then its reply's, named
//! by the hash of their tokens and of every block before them, shared between
//! sequences with the same prefix. When a sequence ends
//! its hashed blocks stay cached, unreferenced, and are evicted least recently
//! used first when a new allocation needs room; usage (vLLM's
//! `kv_cache_usage_perc`) counts only referenced blocks, as vLLM does.

use std::collections::{BTreeMap, HashMap, HashSet};

/// Tokens per KV block: vLLM's default block size.
pub const BLOCK_TOKENS: usize = 16;

/// Blocks needed for `tokens` tokens.
pub fn blocks_for(tokens: usize) -> usize {
    tokens.div_ceil(BLOCK_TOKENS)
}

#[derive(Debug)]
struct CachedBlock {
    refs: u32,
    /// Key in the eviction order while unreferenced.
    stamp: u64,
}

#[derive(Debug)]
pub struct KvCache {
    capacity: usize,
    anonymous: usize,
    cached: HashMap<u64, CachedBlock>,
    /// Unreferenced cached blocks by last use: the eviction order.
    evictable: BTreeMap<u64, u64>,
    clock: u64,
    prefix_caching: bool,
    /// Cached blocks after which a hybrid model's linear-attention state was saved too (vLLM's
    /// `align` mode saves one only where a step ended on a block boundary): where its prefix hits
    /// can end ([`KvCache::saved_state_within`]). A block's mark goes with it.
    states: HashSet<u64>,
}

impl KvCache {
    pub fn new(capacity_blocks: usize, prefix_caching: bool) -> KvCache {
        KvCache {
            capacity: capacity_blocks,
            anonymous: 0,
            cached: HashMap::new(),
            evictable: BTreeMap::new(),
            clock: 0,
            prefix_caching,
            states: HashSet::new(),
        }
    }

    pub fn prefix_caching(&self) -> bool {
        self.prefix_caching
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks an allocation can take now, evicting unreferenced cached blocks if it must.
    pub fn available(&self) -> usize {
        self.capacity - self.anonymous - self.cached.len() + self.evictable.len()
    }

    /// Fraction of blocks held by running sequences.
    pub fn usage(&self) -> f64 {
        let held = self.anonymous + self.cached.len() - self.evictable.len();
        held as f64 / self.capacity.max(1) as f64
    }

    /// Leading blocks of `hashes` already cached.
    pub fn cached_prefix(&self, hashes: &[u64]) -> usize {
        if !self.prefix_caching {
            return 0;
        }
        hashes.iter().take_while(|h| self.cached.contains_key(h)).count()
    }

    /// Marks the cached block `hash` as one after which a linear-attention state was saved.
    pub fn mark_state(&mut self, hash: u64) {
        if self.cached.contains_key(&hash) {
            self.states.insert(hash);
        }
    }

    /// The most of the first `blocks` of `hashes` (cached, [`Self::cached_prefix`]), a whole
    /// number of `page`s, after which a state was saved: a hybrid model's longest prefix hit.
    pub fn saved_state_within(&self, hashes: &[u64], blocks: usize, page: usize) -> usize {
        let page = page.max(1);
        (1..=blocks.min(hashes.len()) / page)
            .rev()
            .map(|p| p * page)
            .find(|&k| self.states.contains(&hashes[k - 1]))
            .unwrap_or(0)
    }

    /// Takes a reference on the first `count` blocks of `hashes`, which [`Self::cached_prefix`] found.
    pub fn share(&mut self, hashes: &[u64]) {
        for hash in hashes {
            if let Some(block) = self.cached.get_mut(hash) {
                if block.refs == 0 {
                    self.evictable.remove(&block.stamp);
                }
                block.refs += 1;
            }
        }
    }

    /// Takes `blocks` anonymous blocks, evicting cached ones; false (and nothing taken) if they do not fit.
    pub fn allocate(&mut self, blocks: usize) -> bool {
        if blocks > self.available() {
            return false;
        }
        let free = self.capacity - self.anonymous - self.cached.len();
        for _ in free..blocks {
            if let Some((_, hash)) = self.evictable.pop_first() {
                self.cached.remove(&hash);
                self.states.remove(&hash);
            }
        }
        self.anonymous += blocks;
        true
    }

    /// Turns anonymous blocks whose tokens are now computed into cached blocks named by `hashes`.
    /// A block another sequence registered meanwhile is shared instead, and the copy freed.
    pub fn register(&mut self, hashes: &[u64]) {
        if !self.prefix_caching {
            return;
        }
        for &hash in hashes {
            self.anonymous = self.anonymous.saturating_sub(1);
            match self.cached.get_mut(&hash) {
                Some(block) => {
                    if block.refs == 0 {
                        self.evictable.remove(&block.stamp);
                    }
                    block.refs += 1;
                }
                None => {
                    self.cached.insert(hash, CachedBlock { refs: 1, stamp: 0 });
                }
            }
        }
    }

    /// Gives back a sequence's blocks: its anonymous ones are freed, its hashed ones stay cached.
    pub fn release(&mut self, anonymous: usize, hashes: &[u64]) {
        self.anonymous = self.anonymous.saturating_sub(anonymous);
        for hash in hashes {
            if let Some(block) = self.cached.get_mut(hash) {
                block.refs = block.refs.saturating_sub(1);
                if block.refs == 0 {
                    self.clock += 1;
                    block.stamp = self.clock;
                    self.evictable.insert(self.clock, *hash);
                }
            }
        }
    }

    /// Drops every unreferenced cached block (`POST /reset_prefix_cache`).
    pub fn reset_prefix_cache(&mut self) {
        for (_, hash) in std::mem::take(&mut self.evictable) {
            self.cached.remove(&hash);
            self.states.remove(&hash);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefixes_are_cached_reused_and_evicted_last_used_first() {
        let mut kv = KvCache::new(10, true);
        assert!(kv.allocate(4));
        kv.register(&[1, 2, 3]);
        assert_eq!((kv.available(), kv.cached_prefix(&[1, 2, 9])), (6, 2));
        kv.release(1, &[1, 2, 3]);
        assert_eq!(kv.usage(), 0.0);
        assert_eq!(kv.available(), 10, "cached blocks can be evicted");
        kv.share(&[1, 2]);
        assert!(kv.allocate(8), "evicts block 3, the only unreferenced one");
        assert_eq!(kv.cached_prefix(&[1, 2, 3]), 2);
        assert!(!kv.allocate(1));
        kv.release(8, &[1, 2]);
        kv.reset_prefix_cache();
        assert_eq!((kv.cached_prefix(&[1]), kv.available()), (0, 10));
    }

    #[test]
    fn a_hybrid_prefix_hit_ends_where_a_state_was_saved() {
        let mut kv = KvCache::new(10, true);
        assert!(kv.allocate(6));
        kv.register(&[1, 2, 3, 4, 5, 6]);
        // Pages of two blocks; a state saved after the fourth block only.
        kv.mark_state(4);
        kv.mark_state(9); // not cached: no mark
        assert_eq!(kv.saved_state_within(&[1, 2, 3, 4, 5, 6], 6, 2), 4);
        assert_eq!(kv.saved_state_within(&[1, 2, 3, 4, 5, 6], 3, 2), 0);
        kv.mark_state(6);
        assert_eq!(kv.saved_state_within(&[1, 2, 3, 4, 5, 6], 6, 2), 6);
        // A block's mark goes with it.
        kv.release(0, &[1, 2, 3, 4, 5, 6]);
        kv.reset_prefix_cache();
        assert!(kv.allocate(6));
        kv.register(&[1, 2, 3, 4, 5, 6]);
        assert_eq!(kv.saved_state_within(&[1, 2, 3, 4, 5, 6], 6, 2), 0);
    }

    #[test]
    fn without_prefix_caching_nothing_is_shared() {
        let mut kv = KvCache::new(4, false);
        assert!(kv.allocate(2));
        kv.register(&[1, 2]);
        assert_eq!(kv.cached_prefix(&[1, 2]), 0);
        kv.release(2, &[]);
        assert_eq!(kv.available(), 4);
    }
}
