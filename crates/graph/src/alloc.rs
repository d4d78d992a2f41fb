//! The allocator (§3.3): the single owner of every buffer (invariant 4).
//!
//! It holds the backends (registered at construction, keyed by their id), computes
//! liveness in build order (deviation 22: never Kahn order), never frees inputs or
//! outputs (deviation 23), aliases in-place ops onto a sole same-backend producer,
//! keeps the per-layer persistent [K, V] regions across rebuilds and resets, and stages
//! cross-backend values in `cross` without touching canonical buffers.
//!
//! Bounded pools: nothing here allocates per request. KV regions are created once per
//! layer and then only rewritten (positions are data); a persistent buffer is created
//! once per name; staging buffers released by a rebuild are kept aside and handed to
//! the next graph's staging before any new one is created.

use std::collections::BTreeMap;

use crate::backend::{BackendImpl, CrossCopy, KvProvider};
use crate::error::GraphError;
use crate::ir::*;

/// One layer's persistent KV pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvRegion {
    /// Backend that first used the layer.
    pub backend: Backend,
    /// K region id in that backend's pool.
    pub k: usize,
    /// V region id in that backend's pool.
    pub v: usize,
    /// Elements per region (`row * rows`, whatever the storage format).
    pub elems: usize,
    /// Elements per row.
    pub row: usize,
    /// Pool words of the K region (its format's `row_words(row)` per row).
    pub k_words: usize,
    /// Pool words of the V region.
    pub v_words: usize,
    /// The pair is a recurrent layer's state (`k`: the conv windows, `v`: the delta-rule
    /// matrices, f32 per slot; see [`crate::RecurrentMeta`]), not rows at positions.
    pub recurrent: bool,
}

/// A staging buffer holding a copy of one node's value on another backend.
#[derive(Debug)]
struct CrossEntry {
    buf: BufRef,
    /// Elements of `buf`.
    len: usize,
    pending: Option<CrossCopy>,
    epoch: u64,
}

/// Owns the backends, the per-graph buffers, the staging copies and the KV regions.
pub struct GraphAllocator {
    backends: BTreeMap<Backend, Box<dyn BackendImpl>>,
    fence: Option<Vec<Backend>>,
    node_to_buf: Vec<Option<BufRef>>,
    node_elems: Vec<usize>,
    held: Vec<BufRef>,
    cross: BTreeMap<(NodeId, Backend), CrossEntry>,
    epoch: u64,
    kv: BTreeMap<usize, KvRegion>,
    /// Staging buffers of earlier graphs, with their lengths, waiting to be reused as
    /// staging. They stay off the backends' free lists: a staging buffer is taken
    /// during execution, when a free-listed buffer may still hold a live value.
    spare_staging: Vec<(BufRef, usize)>,
    /// Every buffer that outlives graph rebuilds, by name.
    pub persistent: Vec<PersistentBuf>,
}

impl std::fmt::Debug for GraphAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphAllocator")
            .field("backends", &self.backends.keys().collect::<Vec<_>>())
            .field("kv", &self.kv)
            .finish_non_exhaustive()
    }
}

fn aliases_input(op: &Op) -> bool {
    matches!(
        op,
        Op::Silu | Op::Gelu | Op::SoftCap(_) | Op::RoPE { .. } | Op::QkvBiasRopeStore { .. }
    )
}

/// The layer, row width and rows of the KV regions a node that touches KV needs.
fn kv_geometry(node: &CNode) -> Option<(usize, usize, usize)> {
    let layer = node.kv_layer()?;
    let per_rows = |elems: usize, n_ctx: usize| match n_ctx {
        0 => (elems, 1),
        n => (elems / n, n),
    };
    let (row, rows) = match &node.meta {
        NodeMeta::Recurrent(_) => return None,
        NodeMeta::Kvcache(m) => (m.n_embd, m.n_ctx),
        NodeMeta::Attn(m) => (m.nkt(), m.n_ctx),
        NodeMeta::FusedQkv(m) => per_rows(m.kv_elems, m.n_ctx),
        NodeMeta::QkvBiasRopeStore(m) => per_rows(m.kv_elems, m.n_ctx),
        NodeMeta::FusedQkvNorm(m) => per_rows(m.kv_elems, m.n_ctx),
        _ => (node.n_elements(), 1),
    };
    Some((layer, row, rows))
}

impl GraphAllocator {
    /// Takes ownership of the backends; each is keyed by its `id()`.
    pub fn new(backends: Vec<Box<dyn BackendImpl>>) -> Result<Self, GraphError> {
        let mut map = BTreeMap::new();
        for b in backends {
            let id = b.id();
            if map.insert(id, b).is_some() {
                return Err(GraphError::DuplicateBackend(id));
            }
        }
        Ok(GraphAllocator {
            backends: map,
            fence: None,
            node_to_buf: Vec::new(),
            node_elems: Vec::new(),
            held: Vec::new(),
            cross: BTreeMap::new(),
            epoch: 0,
            kv: BTreeMap::new(),
            spare_staging: Vec::new(),
            persistent: Vec::new(),
        })
    }

    /// Restricts assignment to `fence` (from `BackendRegistry::parse_fence`); `None` lifts it.
    pub fn set_fence(&mut self, fence: Option<Vec<Backend>>) {
        self.fence = fence;
    }

    /// Registered, fenced-in backends, highest registry priority first (ties by id).
    pub fn priority_order(&self) -> Vec<Backend> {
        let mut v: Vec<Backend> = self
            .backends
            .keys()
            .copied()
            .filter(|b| self.fence.as_ref().is_none_or(|f| f.contains(b)))
            .collect();
        v.sort_by_key(|&b| (std::cmp::Reverse(crate::registry::priority_of(b)), b));
        v
    }

    /// The `CParams` flags that the registered, fenced-in backends imply.
    pub fn backend_caps(&self) -> crate::params::BackendCaps {
        crate::params::BackendCaps::of(
            self.priority_order()
                .into_iter()
                .filter_map(|b| self.backend(b)),
        )
    }

    /// The backend registered under `b`.
    pub fn backend(&self, b: Backend) -> Option<&dyn BackendImpl> {
        self.backends.get(&b).map(|x| x.as_ref())
    }

    /// Mutable access to the backend registered under `b`.
    pub fn backend_mut(&mut self, b: Backend) -> Option<&mut dyn BackendImpl> {
        match self.backends.get_mut(&b) {
            Some(x) => Some(x.as_mut()),
            None => None,
        }
    }

    fn must(&mut self, b: Backend) -> Result<&mut dyn BackendImpl, GraphError> {
        self.backend_mut(b).ok_or(GraphError::BackendMissing(b))
    }

    /// A buffer of `elems` f32s on `b` (from the free list, or `fresh`), checked against
    /// the backend's limits now, when the graph is allocated: a size the device cannot
    /// hold fails here naming `what`, never later at execution or read-back.
    fn alloc_on(
        &mut self,
        b: Backend,
        elems: usize,
        fresh: bool,
        what: impl FnOnce() -> String,
    ) -> Result<usize, GraphError> {
        let x = self.must(b)?;
        let r = if fresh {
            x.try_alloc_fresh(elems)
        } else {
            x.try_alloc_buffer(elems)
        };
        r.map_err(|message| GraphError::Backend {
            backend: x.name().to_string(),
            context: format!("allocating {}", what()),
            message: Box::new(message),
        })
    }

    /// The backend's own name when registered, the registry name otherwise.
    pub fn backend_name(&self, b: Backend) -> String {
        self.backend(b)
            .map_or_else(|| b.name(), |x| x.name().to_string())
    }

    /// Buffers ever created by backend `b`'s pool.
    pub fn pool_len(&self, b: Backend) -> Option<usize> {
        self.backend(b).map(|x| x.pool_len())
    }

    /// Allocates every live node of `graph` (see §3.3 for the steps). Inputs are
    /// allocated first and, like outputs, never freed; an unassigned node lands on
    /// the CPU, matching the scheduler's fallback.
    pub fn alloc_graph(&mut self, graph: &ComputeGraph) -> Result<(), GraphError> {
        self.release_graph_buffers();
        for b in self.backends.values_mut() {
            b.open_alloc_pass();
        }
        graph.validate()?;
        let n = graph.nodes.len();
        let live = |i: usize| !graph.is_dead(i);

        // Liveness in build order: the order the scheduler executes.
        let mut last_use: Vec<usize> = (0..n).collect();
        for node in graph.nodes.iter().filter(|x| live(x.id)) {
            for &s in &node.src {
                last_use[s] = last_use[s].max(node.id);
            }
        }
        for &i in graph.inputs.iter().chain(&graph.outputs) {
            last_use[i] = usize::MAX;
        }
        let pinned = |i: NodeId| graph.inputs.contains(&i) || graph.outputs.contains(&i);
        let consumers = graph.consumer_counts();

        self.node_to_buf = vec![None; n];
        self.node_elems = graph.nodes.iter().map(CNode::n_elements).collect();
        let mut refs: BTreeMap<BufRef, usize> = BTreeMap::new();
        let mut expire: BTreeMap<usize, Vec<BufRef>> = BTreeMap::new();

        // Inputs are host-filled before execution starts, so their lifetime spans the
        // whole pass: give them buffers first, which nothing else can then receive.
        for &i in &graph.inputs {
            let node = &graph.nodes[i];
            let backend = node.backend.unwrap_or(Backend::CPU);
            if self.node_to_buf[i].is_some() || !live(i) {
                continue;
            }
            let buf = BufRef {
                backend,
                id: self.alloc_on(backend, node.n_elements(), false, || {
                    format!("input {i} '{}'", node.name)
                })?,
            };
            refs.insert(buf, 1);
            self.node_to_buf[i] = Some(buf);
        }

        for node in &graph.nodes {
            let i = node.id;
            if !live(i) || self.node_to_buf[i].is_some() {
                continue;
            }
            // Sweep: return buffers whose last reader ran before this node.
            while let Some((&at, _)) = expire.first_key_value() {
                if at >= i {
                    break;
                }
                let (_, bufs) = expire.pop_first().unwrap_or_default();
                for buf in bufs {
                    let left = refs.get_mut(&buf).map(|r| {
                        *r -= 1;
                        *r
                    });
                    if left == Some(0) {
                        refs.remove(&buf);
                        self.must(buf.backend)?.free_buffer(buf.id);
                    }
                }
            }

            let backend = node.backend.unwrap_or(Backend::CPU);
            if !self.backends.contains_key(&backend) {
                return Err(GraphError::BackendMissing(backend));
            }
            if let NodeMeta::Recurrent(m) = &node.meta {
                self.ensure_state(m, backend)?;
            }
            if let Some((layer, row, rows)) = kv_geometry(node) {
                let region = self.ensure_kv_rows(layer, backend, row, rows)?;
                if matches!(node.op, Op::KvcacheStore { .. } | Op::KvcacheLoad { .. }) {
                    self.node_to_buf[i] = Some(BufRef {
                        backend: region.backend,
                        id: region.k,
                    });
                    continue;
                }
            }

            let alias = node.src.first().copied().filter(|&s| {
                aliases_input(&node.op)
                    && consumers[s] == 1
                    && !pinned(s)
                    && graph.nodes[s].n_elements() == node.n_elements()
                    && self.node_to_buf[s]
                        .is_some_and(|b| b.backend == backend && refs.contains_key(&b))
            });
            let buf = match alias.and_then(|s| self.node_to_buf[s]) {
                Some(b) => b,
                None => BufRef {
                    backend,
                    id: self.alloc_on(backend, node.n_elements(), false, || {
                        format!("node {i} '{}' ({})", node.name, node.op.name())
                    })?,
                },
            };
            *refs.entry(buf).or_insert(0) += 1;
            expire.entry(last_use[i]).or_default().push(buf);
            self.node_to_buf[i] = Some(buf);
        }
        self.held = refs.into_keys().collect();
        self.release_unused_buffers();
        Ok(())
    }

    /// Lets each backend drop the free buffers that neither this graph nor the KV,
    /// persistent or staging buffers use (a pool then keeps at most about as much idle
    /// memory as it has in use, whatever shapes earlier graphs had).
    fn release_unused_buffers(&mut self) {
        let mut in_use: BTreeMap<Backend, Vec<usize>> = BTreeMap::new();
        let kv = self.kv.values().flat_map(|r| {
            [
                BufRef {
                    backend: r.backend,
                    id: r.k,
                },
                BufRef {
                    backend: r.backend,
                    id: r.v,
                },
            ]
        });
        let persistent = self.persistent.iter().map(|p| BufRef {
            backend: p.backend,
            id: p.id,
        });
        let staging = self.spare_staging.iter().map(|&(b, _)| b);
        for b in self
            .node_to_buf
            .iter()
            .flatten()
            .copied()
            .chain(kv)
            .chain(persistent)
            .chain(staging)
        {
            in_use.entry(b.backend).or_default().push(b.id);
        }
        for (id, b) in self.backends.iter_mut() {
            b.release_unused(in_use.get(id).map_or(&[], Vec::as_slice));
        }
    }

    /// Elements held by backend `b`'s pool (0 where the backend does not report it).
    pub fn pool_elems(&self, b: Backend) -> Option<usize> {
        self.backend(b).map(|x| x.pool_elems())
    }

    /// Returns the previous graph's surviving buffers to their pools and sets its
    /// staging copies aside for the next graph's staging.
    fn release_graph_buffers(&mut self) {
        let held = std::mem::take(&mut self.held);
        for buf in held {
            if let Some(b) = self.backend_mut(buf.backend) {
                b.free_buffer(buf.id);
            }
        }
        let staged = std::mem::take(&mut self.cross);
        self.spare_staging
            .extend(staged.into_values().map(|e| (e.buf, e.len)));
        self.node_to_buf.clear();
        self.node_elems.clear();
    }

    /// The layer's KV pair, created on `backend` at first use and then kept for the
    /// allocator's lifetime: rebuilds and resets reuse it, so its ids never change.
    pub fn ensure_kv(
        &mut self,
        layer: usize,
        backend: Backend,
        elems: usize,
    ) -> Result<KvRegion, GraphError> {
        self.ensure_kv_rows(layer, backend, elems, 1)
    }

    /// [`Self::ensure_kv`] for `rows` rows of `row` elements: each half is sized in pool
    /// words by the backend's storage format ([`BackendImpl::kv_types`]), so a packed
    /// format holds the same rows in fewer words.
    pub fn ensure_kv_rows(
        &mut self,
        layer: usize,
        backend: Backend,
        row: usize,
        rows: usize,
    ) -> Result<KvRegion, GraphError> {
        let elems = row.checked_mul(rows).ok_or_else(|| GraphError::Kv {
            layer,
            problem: format!("{rows} rows of {row} elements overflow"),
        })?;
        if let Some(r) = self.kv.get(&layer) {
            if r.recurrent || r.elems < elems {
                return Err(GraphError::Kv {
                    layer,
                    problem: format!("region holds {} elements, graph needs {elems}", r.elems),
                });
            }
            return Ok(*r);
        }
        let words = |t: crate::KvType| {
            t.row_words(row)
                .and_then(|w| w.checked_mul(rows))
                .ok_or_else(|| GraphError::Kv {
                    layer,
                    problem: format!(
                        "rows of {row} elements cannot be stored as {t} (blocks of {})",
                        t.block()
                    ),
                })
        };
        let [kt, vt] = self.must(backend)?.kv_types();
        let (k_words, v_words) = (words(kt)?, words(vt)?);
        let k = self.alloc_on(backend, k_words, true, || format!("KV layer {layer} K"))?;
        let v = self.alloc_on(backend, v_words, true, || format!("KV layer {layer} V"))?;
        let region = KvRegion {
            backend,
            k,
            v,
            elems,
            row,
            k_words,
            v_words,
            recurrent: false,
        };
        for (half, id, words) in [("k", k, k_words), ("v", v, v_words)] {
            self.persistent.push(PersistentBuf {
                name: format!("kv.{layer}.{half}"),
                backend,
                id,
                elems: words,
            });
        }
        self.kv.insert(layer, region);
        Ok(region)
    }

    /// The recurrent state region of `m.layer` (invariant 1 extended: a recurrent layer
    /// keeps one f32 conv window and one set of delta-rule matrices per slot, not rows
    /// at positions), created on `backend` at first use and kept like a KV pair; a
    /// layer already holding KV rows, or a smaller region, is an error.
    pub fn ensure_state(
        &mut self,
        m: &RecurrentMeta,
        backend: Backend,
    ) -> Result<KvRegion, GraphError> {
        let layer = m.layer;
        let overflow = || GraphError::Kv {
            layer,
            problem: format!("{} state slots overflow", m.slots),
        };
        let conv = m.conv_slot().checked_mul(m.slots).ok_or_else(overflow)?;
        let ssm = m.ssm_slot().checked_mul(m.slots).ok_or_else(overflow)?;
        if let Some(r) = self.kv.get(&layer) {
            if !r.recurrent || r.k_words < conv || r.v_words < ssm {
                return Err(GraphError::Kv {
                    layer,
                    problem: format!(
                        "region ({} + {} words, recurrent: {}) cannot hold {} state slots",
                        r.k_words, r.v_words, r.recurrent, m.slots
                    ),
                });
            }
            return Ok(*r);
        }
        // A zero-width window (d_conv 1) still gets a one-word buffer.
        let k = self.alloc_on(backend, conv.max(1), true, || {
            format!("recurrent layer {layer} conv windows")
        })?;
        let v = self.alloc_on(backend, ssm.max(1), true, || {
            format!("recurrent layer {layer} state matrices")
        })?;
        let region = KvRegion {
            backend,
            k,
            v,
            elems: conv + ssm,
            row: 0,
            k_words: conv.max(1),
            v_words: ssm.max(1),
            recurrent: true,
        };
        for (half, id, words) in [("conv", k, region.k_words), ("ssm", v, region.v_words)] {
            self.persistent.push(PersistentBuf {
                name: format!("state.{layer}.{half}"),
                backend,
                id,
                elems: words,
            });
        }
        self.kv.insert(layer, region);
        Ok(region)
    }

    /// Copies of every recurrent region's (conv, state) buffers, by layer: a snapshot a
    /// caller can restore with [`Self::restore_states`].
    pub fn snapshot_states(&mut self) -> Vec<(usize, Vec<f32>, Vec<f32>)> {
        let layers: Vec<(usize, KvRegion)> = self
            .kv
            .iter()
            .filter(|(_, r)| r.recurrent)
            .map(|(&l, &r)| (l, r))
            .collect();
        let mut out = Vec::with_capacity(layers.len());
        for (l, r) in layers {
            let Some(b) = self.backend_mut(r.backend) else {
                continue;
            };
            if let (Some(mut conv), Some(mut ssm)) = (b.copy_to_host(r.k), b.copy_to_host(r.v)) {
                conv.truncate(r.k_words);
                ssm.truncate(r.v_words);
                out.push((l, conv, ssm));
            }
        }
        out
    }

    /// Copies state slot `src` into slot `dst` in every recurrent region, each holding
    /// `slots` equal slots.
    pub fn copy_state_slot(
        &mut self,
        src: usize,
        dst: usize,
        slots: usize,
    ) -> Result<(), GraphError> {
        let regions: Vec<(usize, KvRegion)> = self
            .kv
            .iter()
            .filter(|(_, r)| r.recurrent)
            .map(|(&l, &r)| (l, r))
            .collect();
        for (layer, r) in regions {
            if src >= slots || dst >= slots {
                return Err(GraphError::Kv {
                    layer,
                    problem: format!("state slots {src} -> {dst} outside 0..{slots}"),
                });
            }
            let b = self.must(r.backend)?;
            let name = b.name().to_string();
            let fail = |message: crate::BackendError| GraphError::Backend {
                backend: name.clone(),
                context: format!("copying state slot {src} to {dst} of layer {layer}"),
                message: Box::new(message),
            };
            for (id, words) in [(r.k, r.k_words), (r.v, r.v_words)] {
                let per = words / slots;
                let data = b.read_host_window(id, src * per, per).map_err(fail)?;
                b.write_host_window(id, dst * per, &data).map_err(fail)?;
            }
        }
        Ok(())
    }

    /// Writes a snapshot from [`Self::snapshot_states`] back into the regions.
    pub fn restore_states(
        &mut self,
        snap: &[(usize, Vec<f32>, Vec<f32>)],
    ) -> Result<(), GraphError> {
        for (layer, conv, ssm) in snap {
            let r = self
                .kv
                .get(layer)
                .copied()
                .filter(|r| r.recurrent && r.k_words == conv.len() && r.v_words == ssm.len())
                .ok_or_else(|| GraphError::Kv {
                    layer: *layer,
                    problem: "the snapshot does not match the recurrent region".into(),
                })?;
            let b = self.must(r.backend)?;
            for (id, data) in [(r.k, conv), (r.v, ssm)] {
                b.write_host_window(id, 0, data)
                    .map_err(|message| GraphError::Backend {
                        backend: b.name().to_string(),
                        context: format!("restoring recurrent state of layer {layer}"),
                        message: Box::new(message),
                    })?;
            }
        }
        Ok(())
    }

    /// The layer's KV region, if created.
    pub fn kv_region(&self, layer: usize) -> Option<KvRegion> {
        self.kv.get(&layer).copied()
    }

    /// Zero-fills every KV region in place. The regions and their pool ids stay (a reset
    /// needs no new region); an engine starting a new sequence does not need this, as
    /// attention reads only rows its sequence has written (see `Engine::reset`).
    pub fn reset_kv(&mut self) -> Result<(), GraphError> {
        let regions: Vec<KvRegion> = self.kv.values().copied().collect();
        let zeros = [0f32; 1024];
        for r in regions {
            let b = self.must(r.backend)?;
            for (id, words) in [(r.k, r.k_words), (r.v, r.v_words)] {
                let mut offset = 0;
                while offset < words {
                    let n = (words - offset).min(zeros.len());
                    b.write_host_window(id, offset, &zeros[..n])
                        .map_err(|message| GraphError::Backend {
                            backend: b.name().to_string(),
                            context: format!("clearing KV buffer {id}"),
                            message: Box::new(message),
                        })?;
                    offset += n;
                }
            }
        }
        Ok(())
    }

    /// A named buffer outside liveness that survives rebuilds, created once per name:
    /// asking again for `name` returns the same buffer, and a different backend or size
    /// for an existing name is an error.
    pub fn alloc_persistent(
        &mut self,
        name: &str,
        backend: Backend,
        size: usize,
    ) -> Result<BufRef, GraphError> {
        if let Some(p) = self.persistent.iter().find(|p| p.name == name) {
            if p.backend != backend || p.elems != size {
                return Err(GraphError::Persistent {
                    name: name.to_string(),
                    problem: format!(
                        "exists on {} with {} elements, requested on {} with {size}",
                        self.backend_name(p.backend),
                        p.elems,
                        self.backend_name(backend)
                    ),
                });
            }
            return Ok(BufRef { backend, id: p.id });
        }
        let id = self.alloc_on(backend, size, true, || {
            format!("persistent buffer '{name}'")
        })?;
        self.persistent.push(PersistentBuf {
            name: name.to_string(),
            backend,
            id,
            elems: size,
        });
        Ok(BufRef { backend, id })
    }

    /// A staging buffer that bypasses the free list until the next `alloc_graph`.
    pub fn alloc_fresh(&mut self, backend: Backend, size: usize) -> Result<BufRef, GraphError> {
        let id = self.alloc_on(backend, size, true, || {
            format!("a staging buffer of {size}")
        })?;
        Ok(BufRef { backend, id })
    }

    /// The canonical buffer of `id` in the current graph.
    pub fn node_buffer(&self, id: NodeId) -> Option<BufRef> {
        self.node_to_buf.get(id).copied().flatten()
    }

    /// Fills the f32 input called `name`; `data` must match its element count.
    pub fn fill_input(
        &mut self,
        graph: &ComputeGraph,
        name: &str,
        data: &[f32],
    ) -> Result<(), GraphError> {
        let id = graph
            .input_by_name(name)
            .ok_or_else(|| GraphError::UnknownInput(name.to_string()))?;
        let expected = graph.nodes[id].n_elements();
        if data.len() != expected {
            return Err(GraphError::LengthMismatch {
                name: name.to_string(),
                expected,
                got: data.len(),
            });
        }
        let buf = self.node_buffer(id).ok_or_else(|| GraphError::NoBuffer {
            id,
            name: name.to_string(),
        })?;
        let b = self.must(buf.backend)?;
        b.write_host(buf.id, data)
            .map_err(|message| GraphError::Backend {
                backend: b.name().to_string(),
                context: format!("fill input '{name}'"),
                message: Box::new(message),
            })
    }

    /// Fills an I32 input, storing each value as an f32 bit pattern (deviation 8).
    pub fn fill_input_i32(
        &mut self,
        graph: &ComputeGraph,
        name: &str,
        data: &[i32],
    ) -> Result<(), GraphError> {
        self.fill_input_bits(graph, name, data.len(), data.iter().map(|&v| v as u32))
    }

    /// `fill_input_i32` for unsigned ids (token ids, cells).
    pub fn fill_input_u32(
        &mut self,
        graph: &ComputeGraph,
        name: &str,
        data: &[u32],
    ) -> Result<(), GraphError> {
        self.fill_input_bits(graph, name, data.len(), data.iter().copied())
    }

    /// Writes `len` I32 values as f32 bit patterns through a stack buffer, window by
    /// window, so filling the inputs of a reused graph does not allocate.
    fn fill_input_bits(
        &mut self,
        graph: &ComputeGraph,
        name: &str,
        len: usize,
        values: impl Iterator<Item = u32>,
    ) -> Result<(), GraphError> {
        let id = graph
            .input_by_name(name)
            .ok_or_else(|| GraphError::UnknownInput(name.to_string()))?;
        let expected = graph.nodes[id].n_elements();
        if len != expected {
            return Err(GraphError::LengthMismatch {
                name: name.to_string(),
                expected,
                got: len,
            });
        }
        let buf = self.node_buffer(id).ok_or_else(|| GraphError::NoBuffer {
            id,
            name: name.to_string(),
        })?;
        let b = self.must(buf.backend)?;
        let mut chunk = [0f32; 256];
        let mut n = 0;
        let mut offset = 0;
        let flush = |b: &mut dyn BackendImpl, chunk: &[f32], offset: usize| {
            b.write_host_window(buf.id, offset, chunk)
                .map_err(|message| GraphError::Backend {
                    backend: b.name().to_string(),
                    context: format!("fill input '{name}'"),
                    message: Box::new(message),
                })
        };
        for v in values {
            chunk[n] = f32::from_bits(v);
            n += 1;
            if n == chunk.len() {
                flush(&mut *b, &chunk, offset)?;
                offset += n;
                n = 0;
            }
        }
        if n > 0 {
            flush(&mut *b, &chunk[..n], offset)?;
        }
        Ok(())
    }

    /// A borrowed view of node `id`'s buffer where its backend is host-visible.
    pub fn get_buffer(&self, id: NodeId) -> Option<&[f32]> {
        let buf = self.node_buffer(id)?;
        self.backend(buf.backend)?.read_host(buf.id)
    }

    /// A host copy of node `id`'s value, from any backend (synchronizes it).
    pub fn copy_to_cpu(&mut self, id: NodeId) -> Option<Vec<f32>> {
        let buf = self.node_buffer(id)?;
        let mut v = self.backend_mut(buf.backend)?.copy_to_host(buf.id)?;
        if let Some(&n) = self.node_elems.get(id) {
            v.truncate(n);
        }
        Some(v)
    }

    /// Node `id`'s value into `out` (replacing its contents), reusing `out`'s capacity
    /// where the backend is host-visible; `false` when the node has no readable buffer.
    pub fn read_into(&mut self, id: NodeId, out: &mut Vec<f32>) -> bool {
        let n = self.node_elems.get(id).copied();
        if let Some(v) = self.get_buffer(id) {
            let v = &v[..n.unwrap_or(v.len()).min(v.len())];
            out.clear();
            out.extend_from_slice(v);
            return true;
        }
        match self.copy_to_cpu(id) {
            Some(v) => {
                *out = v;
                true
            }
            None => false,
        }
    }

    /// Host copies of the layer's (K, V) regions.
    pub fn copy_kv_to_cpu(&mut self, layer: usize) -> Option<(Vec<f32>, Vec<f32>)> {
        let r = self.kv_region(layer)?;
        let b = self.backend_mut(r.backend)?;
        Some((b.copy_to_host(r.k)?, b.copy_to_host(r.v)?))
    }

    /// Starts an execution pass: staged copies become stale and are redone once each.
    pub fn begin_pass(&mut self) {
        self.epoch += 1;
    }

    /// Phase one: enqueue the copy of node `node` into a staging buffer on `dst`
    /// (allocated once per graph). A no-op if this pass already enqueued it.
    pub fn enqueue_cross(&mut self, node: NodeId, dst: Backend) -> Result<(), GraphError> {
        self.enqueue_cross_inner(node, dst, false)
    }

    fn enqueue_cross_inner(
        &mut self,
        node: NodeId,
        dst: Backend,
        force: bool,
    ) -> Result<(), GraphError> {
        let src = self.node_buffer(node).ok_or_else(|| GraphError::NoBuffer {
            id: node,
            name: format!("#{node}"),
        })?;
        if src.backend == dst {
            return Ok(());
        }
        let epoch = self.epoch;
        let staging = match self.cross.get(&(node, dst)) {
            Some(e) if e.epoch == epoch && !force => return Ok(()),
            Some(e) => (e.buf, e.len),
            None => {
                let n = self.node_elems.get(node).copied().unwrap_or(0);
                let spare = self
                    .spare_staging
                    .iter()
                    .position(|&(b, len)| b.backend == dst && len == n);
                match spare {
                    Some(i) => self.spare_staging.swap_remove(i),
                    None => (self.alloc_fresh(dst, n)?, n),
                }
            }
        };
        let (staging, staging_len) = staging;
        let sb = self.must(src.backend)?;
        let copy = sb
            .copy_cross(src.id)
            .map_err(|message| GraphError::Backend {
                backend: sb.name().to_string(),
                context: format!("copy_cross of node {node}"),
                message: Box::new(message),
            })?;
        self.cross.insert(
            (node, dst),
            CrossEntry {
                buf: staging,
                len: staging_len,
                pending: Some(copy),
                epoch,
            },
        );
        Ok(())
    }

    /// Phase two: wait for the staged copy of `node` on `dst` and land it in staging.
    pub fn await_cross(&mut self, node: NodeId, dst: Backend) -> Result<(), GraphError> {
        let Some(entry) = self.cross.get_mut(&(node, dst)) else {
            return Ok(());
        };
        let Some(mut copy) = entry.pending.take() else {
            return Ok(());
        };
        let staging = entry.buf;
        let src = self.node_buffer(node).map_or(Backend::CPU, |b| b.backend);
        let sb = self.must(src)?;
        let data = sb
            .await_cross(&mut copy)
            .map_err(|message| GraphError::Backend {
                backend: sb.name().to_string(),
                context: format!("await_cross of node {node}"),
                message: Box::new(message),
            })?;
        let db = self.must(dst)?;
        db.write_host(staging.id, &data)
            .map_err(|message| GraphError::Backend {
                backend: db.name().to_string(),
                context: format!("staging write of node {node}"),
                message: Box::new(message),
            })
    }

    /// Waits for every copy still in flight (after the last split).
    pub fn drain_cross(&mut self) -> Result<(), GraphError> {
        let pending: Vec<(NodeId, Backend)> = self
            .cross
            .iter()
            .filter(|(_, e)| e.pending.is_some())
            .map(|(&k, _)| k)
            .collect();
        for (node, dst) in pending {
            self.await_cross(node, dst)?;
        }
        Ok(())
    }

    /// The checked staging read: refuses an entry whose wait has not been issued.
    pub fn cross_input(&self, node: NodeId, dst: Backend) -> Result<Option<BufRef>, GraphError> {
        match self.cross.get(&(node, dst)) {
            None => Ok(None),
            Some(e) if e.pending.is_some() => Err(GraphError::CrossNotAwaited {
                node,
                backend: self.backend_name(dst),
            }),
            Some(e) => Ok(Some(e.buf)),
        }
    }

    /// The staging buffer holding `node`'s value on `dst`, if one exists.
    pub fn cross_buffer(&self, node: NodeId, dst: Backend) -> Option<BufRef> {
        self.cross.get(&(node, dst)).map(|e| e.buf)
    }

    /// Copies `node`'s value to `dst` now (both phases); the canonical buffer is untouched.
    pub fn copy_across(&mut self, node: NodeId, dst: Backend) -> Result<(), GraphError> {
        self.enqueue_cross_inner(node, dst, true)?;
        self.await_cross(node, dst)
    }
}

impl KvProvider for GraphAllocator {
    fn kv_pair(&self, layer: usize) -> Option<(usize, usize)> {
        self.kv.get(&layer).map(|r| (r.k, r.v))
    }
}
