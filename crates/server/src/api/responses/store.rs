//! The responses the server keeps for `previous_response_id`, `GET /v1/responses/{id}`
//! and its `input_items`: in memory only, at most [`CAPACITY`] of them, each for at most
//! [`TTL`]; the oldest goes first when the store is full, and `DELETE` drops one at
//! once. A restart forgets them.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use minfer_tokenizer::ChatMessage;
use serde_json::Value;

/// Most responses kept.
pub const CAPACITY: usize = 256;

/// Longest a response is kept.
pub const TTL: Duration = Duration::from_secs(3600);

/// One kept response.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The response object as answered.
    pub response: Value,
    /// The conversation it ends (without `instructions`, which do not carry over):
    /// what a request continuing it starts from.
    pub history: Vec<ChatMessage>,
    /// The model that answered (a continuation without `model` uses it).
    pub model: String,
    /// The request's own `input` as Responses items, each with an `id`, in the order
    /// sent (what `GET /v1/responses/{id}/input_items` lists).
    pub input_items: Vec<Value>,
}

/// The store.
#[derive(Debug, Default)]
pub struct Store {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<String, (Instant, Entry)>,
    order: VecDeque<String>,
}

impl Inner {
    fn expire(&mut self, now: Instant) {
        while let Some(id) = self.order.front() {
            let stale = self
                .map
                .get(id)
                .is_none_or(|(t, _)| now.duration_since(*t) > TTL);
            if !stale && self.order.len() <= CAPACITY {
                break;
            }
            if let Some(id) = self.order.pop_front() {
                self.map.remove(&id);
            }
        }
    }
}

impl Store {
    /// Keeps `entry` under `id`, dropping expired responses and the oldest past
    /// [`CAPACITY`].
    pub fn put(&self, id: String, entry: Entry) {
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if s.map.insert(id.clone(), (now, entry)).is_none() {
            s.order.push_back(id);
        }
        s.expire(now);
    }

    /// The response kept under `id`, unless it expired or was never kept.
    pub fn get(&self, id: &str) -> Option<Entry> {
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        s.expire(Instant::now());
        s.map.get(id).map(|(_, e)| e.clone())
    }

    /// Drops the response kept under `id`; false when there was none (expired, never
    /// kept, or already deleted).
    pub fn remove(&self, id: &str) -> bool {
        let mut s = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        s.expire(Instant::now());
        let found = s.map.remove(id).is_some();
        if found {
            // Out of the age order too, so that the slot it held is free at once and a
            // response put again under the id is not listed twice.
            s.order.retain(|k| k != id);
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored entry that says which it is.
    fn e(n: usize) -> Entry {
        Entry {
            response: serde_json::json!({"n": n}),
            history: Vec::new(),
            model: "m".into(),
            input_items: Vec::new(),
        }
    }

    #[test]
    fn the_store_is_bounded_and_forgets_the_oldest_first() {
        let s = Store::default();
        for n in 0..CAPACITY + 3 {
            s.put(format!("resp_{n}"), e(n));
        }
        assert!(s.get("resp_0").is_none());
        assert!(s.get("resp_2").is_none());
        assert_eq!(s.get("resp_3").unwrap().response["n"], 3);
        assert_eq!(
            s.get(&format!("resp_{}", CAPACITY + 2)).unwrap().response["n"],
            CAPACITY + 2
        );
        assert_eq!(s.inner.lock().unwrap().map.len(), CAPACITY);
    }

    #[test]
    fn a_deleted_response_is_gone_and_frees_its_place() {
        let s = Store::default();
        for n in 0..CAPACITY {
            s.put(format!("resp_{n}"), e(n));
        }
        assert!(s.remove("resp_5"));
        assert!(s.get("resp_5").is_none());
        assert!(!s.remove("resp_5"), "a second delete finds nothing");
        assert!(!s.remove("resp_nope"));
        // The freed place takes a new response without pushing out the oldest.
        s.put("resp_new".into(), e(0));
        assert!(s.get("resp_0").is_some());
        let inner = s.inner.lock().unwrap();
        assert_eq!((inner.map.len(), inner.order.len()), (CAPACITY, CAPACITY));
    }
}
