//! The per-node trace on the device (§8.3): while a split executes, each traced node's
//! output is copied, right after the node's own kernels in the split's one command
//! encoder, into mappable staging owned by the scheduler's trace state; at the end of
//! the split the staging is mapped once, after the split's one wait, and each output is
//! handed to the host capture, which computes from the same f32 values what it computes
//! from a CPU buffer. A later node reusing the buffer runs after the copy, so nothing is
//! read too late, and no node costs a synchronisation of its own.
//!
//! Memory: staging comes in chunks of [`CHUNK_WORDS`] (or one node's output, when
//! larger), reused from step to step while the trace is on and dropped with it. Past
//! [`CEILING_WORDS`] staged in one split, what is staged is handed over first (one more
//! wait), so a step holds at most the ceiling or its largest output, whichever is more.

use std::sync::atomic::Ordering;

use minfer_graph::trace::TraceStaging;
use minfer_graph::BackendError;
use minfer_graph::NodeId;

use super::WgpuBackend;

/// Values (f32) per staging chunk: a decode step of a 0.5B model fits in one.
pub(crate) const CHUNK_WORDS: usize = 1 << 20;
/// Values staged in one split before they are handed over mid-split (64 MiB).
pub(crate) const CEILING_WORDS: usize = 1 << 24;

/// One mappable staging buffer and how much of it the current split filled.
struct Chunk {
    buf: wgpu::Buffer,
    cap: usize,
    fill: usize,
}

/// One staged output: its node, chunk, first value and length.
struct Staged {
    node: NodeId,
    chunk: usize,
    off: usize,
    len: usize,
}

/// What the wgpu backend keeps in a [`TraceStaging`].
pub(crate) struct Staging {
    chunks: Vec<Chunk>,
    /// The chunk being filled.
    cur: usize,
    staged: Vec<Staged>,
    chunk_words: usize,
    ceiling_words: usize,
}

impl Default for Staging {
    fn default() -> Self {
        Self::with_limits(CHUNK_WORDS, CEILING_WORDS)
    }
}

impl Staging {
    /// Staging with other chunk and ceiling sizes (the tests exercise both paths).
    pub(crate) fn with_limits(chunk_words: usize, ceiling_words: usize) -> Self {
        Staging {
            chunks: Vec::new(),
            cur: 0,
            staged: Vec::new(),
            chunk_words,
            ceiling_words,
        }
    }

    fn capacity(&self) -> usize {
        self.chunks.iter().map(|c| c.cap).sum()
    }

    /// A chunk with room for `len` values from the current one on, if there is one.
    fn room(&mut self, len: usize) -> Option<usize> {
        while let Some(c) = self.chunks.get(self.cur) {
            if c.cap - c.fill >= len {
                return Some(self.cur);
            }
            // Chunks after the current one are empty; a full one is left behind.
            if self.cur + 1 >= self.chunks.len() {
                return None;
            }
            self.cur += 1;
        }
        None
    }
}

impl WgpuBackend {
    /// [`minfer_graph::BackendImpl::trace_stage`] on this device.
    pub(crate) fn stage_trace(
        &mut self,
        staging: &mut TraceStaging,
        node: NodeId,
        id: usize,
        len: usize,
        read: &mut dyn FnMut(NodeId, &[f32]),
    ) -> Result<(), BackendError> {
        let have = self
            .pool
            .bufs
            .get(id)
            .ok_or_else(|| format!("node {node}: buffer {id} does not exist"))?
            .len;
        let len = len.min(have);
        let st = staging.state_mut::<Staging>();
        if len == 0 {
            st.staged.push(Staged {
                node,
                chunk: 0,
                off: 0,
                len: 0,
            });
            return Ok(());
        }
        let chunk = match st.room(len) {
            Some(c) => c,
            None if st.chunks.is_empty()
                || st.capacity() + st.chunk_words.max(len) <= st.ceiling_words =>
            {
                self.new_chunk(st, len)
            }
            None => {
                // The ceiling: hand over what this split staged, then start again.
                self.collect_trace(staging, read)?;
                let st = staging.state_mut::<Staging>();
                match st.room(len) {
                    Some(c) => c,
                    None => {
                        // Larger than every chunk: it replaces them, so the bound holds.
                        st.chunks.clear();
                        self.new_chunk(st, len)
                    }
                }
            }
        };
        let st = staging.state_mut::<Staging>();
        let c = &mut st.chunks[chunk];
        let off = c.fill;
        c.fill += len;
        let dst = c.buf.clone();
        st.staged.push(Staged {
            node,
            chunk,
            off,
            len,
        });
        let src = self.pool.bufs[id].mem.clone();
        self.encoder()
            .copy_buffer_to_buffer(&src, 0, &dst, (off * 4) as u64, (len * 4) as u64);
        Ok(())
    }

    /// A new empty chunk of at least `len` values, made the current one.
    fn new_chunk(&self, st: &mut Staging, len: usize) -> usize {
        let cap = st.chunk_words.max(len);
        let buf = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("trace staging"),
            size: (cap * 4) as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        st.chunks.push(Chunk { buf, cap, fill: 0 });
        st.cur = st.chunks.len() - 1;
        st.cur
    }

    /// [`minfer_graph::BackendImpl::trace_collect`] on this device: submits the split,
    /// maps every filled chunk, waits once, and hands each staged output over.
    pub(crate) fn collect_trace(
        &mut self,
        staging: &mut TraceStaging,
        read: &mut dyn FnMut(NodeId, &[f32]),
    ) -> Result<(), BackendError> {
        self.submit();
        let st = staging.state_mut::<Staging>();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut mapped = Vec::new();
        for (i, c) in st.chunks.iter().enumerate().filter(|(_, c)| c.fill > 0) {
            let tx = tx.clone();
            c.buf
                .map_async(wgpu::MapMode::Read, ..(c.fill * 4) as u64, move |r| {
                    let _ = tx.send((i, r));
                });
            mapped.push(i);
        }
        drop(tx);
        // The split's one wait: its kernels, its copies and the maps all complete here.
        let waited = self.wait();
        let mut failed = None;
        for _ in &mapped {
            match rx.recv() {
                Ok((_, Ok(()))) => {}
                Ok((i, Err(e))) => failed = Some(format!("mapping trace staging {i}: {e}")),
                Err(_) => failed = Some("a trace staging map never completed".into()),
            }
        }
        let result = waited.and_then(|()| match failed {
            Some(e) => Err(e.into()),
            None => self.hand_over(st, read),
        });
        for &i in &mapped {
            st.chunks[i].buf.unmap();
        }
        for c in &mut st.chunks {
            c.fill = 0;
        }
        st.cur = 0;
        st.staged.clear();
        result?;
        self.take_errors()
    }

    /// Hands each staged output, read from the mapped chunks, to `read` in order.
    fn hand_over(
        &self,
        st: &Staging,
        read: &mut dyn FnMut(NodeId, &[f32]),
    ) -> Result<(), BackendError> {
        let mut views = Vec::with_capacity(st.chunks.len());
        for c in &st.chunks {
            views.push(if c.fill > 0 {
                Some(
                    c.buf
                        .get_mapped_range(..(c.fill * 4) as u64)
                        .map_err(|e| format!("reading trace staging: {e}"))?,
                )
            } else {
                None
            });
        }
        let mut copy = Vec::new();
        for s in &st.staged {
            if s.len == 0 {
                read(s.node, &[]);
                continue;
            }
            let bytes = views
                .get(s.chunk)
                .and_then(Option::as_ref)
                .and_then(|v| v.get(s.off * 4..(s.off + s.len) * 4))
                .ok_or_else(|| format!("node {}: staged values outside the staging", s.node))?;
            // Mapped memory is word aligned on every driver seen; a copy covers the rest.
            match bytemuck::try_cast_slice::<u8, f32>(bytes) {
                Ok(v) => read(s.node, v),
                Err(_) => {
                    copy.clear();
                    copy.extend(
                        bytes
                            .chunks_exact(4)
                            .map(|b| f32::from_ne_bytes([b[0], b[1], b[2], b[3]])),
                    );
                    read(s.node, &copy);
                }
            }
        }
        Ok(())
    }

    /// How many times this backend has waited for the device (test hook: a traced
    /// split must cost no wait beyond the one every split has).
    #[doc(hidden)]
    pub fn waits(&self) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
        std::sync::Arc::clone(&self.waits)
    }

    pub(crate) fn count_wait(&self) {
        self.waits.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_graph::trace::capture;
    use minfer_graph::{Backend, BackendImpl, CNode, DType, NodeMeta, Op};

    fn node(id: usize, n: usize) -> CNode {
        CNode {
            id,
            name: format!("n{id}"),
            op: Op::Add,
            src: vec![],
            out_shape: [n, 1, 1, 1],
            out_dtype: DType::F32,
            backend: Some(Backend::WGPU),
            meta: NodeMeta::None,
        }
    }

    /// Stages `outputs` (overwriting one device buffer between stages, as a later node
    /// reusing it would) with `st`, and returns what the host capture makes of them and
    /// the waits it cost.
    /// Each staged output as the capture received it: node id and values.
    type Received = Vec<(usize, Vec<f32>)>;

    fn staged(st: Staging, outputs: &[Vec<f32>]) -> Option<(Received, usize)> {
        let mut g = crate::testing::gpu()?;
        let waits = g.waits();
        let len = outputs.iter().map(Vec::len).max().unwrap_or(1);
        let buf = g.alloc_fresh(len);
        let mut staging = TraceStaging::default();
        *staging.state_mut::<Staging>() = st;
        let mut got = Vec::new();
        let before = waits.load(Ordering::Relaxed);
        let mut read = |id: usize, v: &[f32]| got.push((id, v.to_vec()));
        for (i, o) in outputs.iter().enumerate() {
            g.write_host_window(buf, 0, o).unwrap();
            g.trace_stage(&mut staging, i, buf, o.len(), &mut read)
                .unwrap();
        }
        g.trace_collect(&mut staging, &mut read).unwrap();
        Some((got, waits.load(Ordering::Relaxed) - before))
    }

    fn outputs() -> Vec<Vec<f32>> {
        let mut a: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin() * 1e3).collect();
        a[7] = f32::NAN;
        a[9] = f32::INFINITY;
        let b: Vec<f32> = (0..300).map(|i| i as f32 - 150.5).collect();
        vec![a, b.clone(), vec![], b[..5].to_vec(), vec![2.5; 700]]
    }

    #[test]
    fn staged_outputs_capture_as_the_host_buffers_do_with_one_wait() {
        let want = outputs();
        let Some((got, waits)) = staged(Staging::default(), &want) else {
            return;
        };
        assert_eq!(waits, 1, "one wait for the whole split");
        assert_eq!(got.len(), want.len());
        for (i, ((id, v), w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(*id, i);
            // Bit for bit, NaN included: the capture then computes the same numbers.
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(v), bits(w), "output {i}");
            let n = node(i, w.len());
            assert_eq!(capture(&n, v, 16), capture(&n, w, 16));
        }
    }

    #[test]
    fn past_the_ceiling_staging_is_handed_over_first_and_stays_bounded() {
        let want = outputs();
        // Chunks of 256 values, at most 1024 staged: the 1000-value output takes a chunk
        // of its own, and later outputs hand over what is staged before going on.
        let Some((got, waits)) = staged(Staging::with_limits(256, 1024), &want) else {
            return;
        };
        assert!(waits >= 2, "the ceiling forced a hand-over: {waits} waits");
        let ids: Vec<usize> = got.iter().map(|g| g.0).collect();
        assert_eq!(ids, [0, 1, 2, 3, 4], "in staging order");
        for ((_, v), w) in got.iter().zip(&want) {
            assert_eq!(v.len(), w.len());
            assert!(v.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
}
