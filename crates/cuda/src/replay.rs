//! CUDA Graph capture and replay of the backend's splits (design §9.4), as a state
//! machine over an abstract [`Launcher`] so it is tested without a device.
//!
//! The backend records each split's work (kernel launches, host uploads through the
//! pinned staging area, copies, clears) as [`Cmd`]s and runs them at the split's end.
//! A split is keyed by its node range, the one the scheduler opens it with
//! (`BackendImpl::begin_split`), and its commands: the engine's `GraphCache` reuses a
//! graph (one uid) with the same buffers, so the same (uid, node range) yields the same
//! commands, and equal commands are equal work whichever graph they came from (so the
//! uid is not part of the key; the commands identify the work exactly).
//! Upload data is not part of the key: it goes into the same pinned staging slots each
//! time, which the captured copy nodes read.
//!
//! The first [`WARMUP_RUNS`] executions of a key launch directly; the next captures the
//! commands into a graph and replays it; later ones replay. Any change of the pool
//! generation (a buffer allocated, dropped or moved, the staging or scratch area grown)
//! drops every captured graph, since they hold device addresses. Replay is off when the
//! backend options' `device_graphs` is (`MINFER_CUDA_GRAPHS=0` at the command line, and
//! while per-node tracing or profiling is on).

use std::collections::HashMap;

use crate::dispatch::Geom;
use crate::kernels::Kernel;

/// Direct executions of a split before it is captured (the capture is the next one).
pub const WARMUP_RUNS: u32 = 2;
/// Splits remembered before the table is dropped wholesale (prompts of ever new
/// lengths each make a split that never reaches capture).
pub const MAX_SPLITS: usize = 1024;

/// One kernel argument, resolved to a device address or a value at launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arg {
    /// A pool buffer by id.
    Buf(usize),
    /// A registered weight's storage by index.
    Weight(usize),
    /// The quantized-activation scratch area at this byte offset.
    Scratch(usize),
    /// Element `offset` of a pool buffer (a segment of a fused node's output).
    BufAt(usize, usize),
    /// Snapshot area `(slot, len)`: a copy of a source that aliases the output, or a
    /// temporary of a fused epilogue.
    Snap(usize, usize),
    /// A 32-bit unsigned value.
    U32(u32),
    /// A 32-bit float, by its bits (so commands hash and compare exactly).
    F32(u32),
}

/// One unit of recorded device work.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Cmd {
    /// A kernel launch.
    Launch {
        /// Entry point.
        kernel: Kernel,
        /// Grid, block and shared memory.
        geom: Geom,
        /// Arguments in the kernel's parameter order.
        args: Vec<Arg>,
    },
    /// `len` f32s from the pinned staging area at `staging` into buffer `dst` at `offset`.
    Upload {
        /// Destination buffer.
        dst: usize,
        /// First f32 written.
        offset: usize,
        /// Values.
        len: usize,
        /// Offset in the staging area, in f32s.
        staging: usize,
    },
    /// `len` f32s from `src` to `dst` (each a buffer or a snapshot area).
    Copy {
        /// Source.
        src: Arg,
        /// Destination.
        dst: Arg,
        /// Values.
        len: usize,
    },
    /// Zero-fill buffer `dst` of `len` f32s.
    Zero {
        /// Buffer.
        dst: usize,
        /// Its length in f32s.
        len: usize,
    },
}

/// What identifies a split's work: its node range and its commands.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SplitKey {
    /// First and one-past-last node id executed in the split (0, 0 for host-only work).
    pub nodes: (usize, usize),
    /// The commands, upload data excluded.
    pub cmds: Vec<Cmd>,
}

/// How one split was run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Launched command by command.
    Direct,
    /// Captured into a graph, which then ran.
    Capture,
    /// A captured graph replayed.
    Replay,
}

/// The device side of replay: running commands, capturing them, replaying a capture.
pub trait Launcher {
    /// A captured, instantiated graph (destroyed when dropped).
    type Graph;
    /// Runs `cmds` now, in order.
    fn direct(&mut self, cmds: &[Cmd]) -> Result<(), String>;
    /// Captures `cmds` into a graph without running them.
    fn capture(&mut self, cmds: &[Cmd]) -> Result<Self::Graph, String>;
    /// Runs a captured graph.
    fn replay(&mut self, graph: &Self::Graph) -> Result<(), String>;
}

enum Slot<G> {
    /// Executed directly this many times.
    Warm(u32),
    /// Captured.
    Ready(G),
}

/// The captured graphs of one backend, keyed by [`SplitKey`], valid for one pool
/// generation.
pub struct ReplayCache<G> {
    slots: HashMap<SplitKey, Slot<G>>,
    generation: u64,
    enabled: bool,
}

impl<G> ReplayCache<G> {
    /// An empty cache; with `enabled` false every split runs directly.
    pub fn new(enabled: bool) -> Self {
        ReplayCache {
            slots: HashMap::new(),
            generation: 0,
            enabled,
        }
    }

    /// Whether captures are made at all.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Captured graphs held now.
    pub fn captured(&self) -> usize {
        self.slots
            .values()
            .filter(|s| matches!(s, Slot::Ready(_)))
            .count()
    }

    /// Drops every captured graph (the addresses they hold may be stale).
    pub fn invalidate(&mut self) {
        self.slots.clear();
    }

    /// Runs the split `key` through `launcher` for pool generation `generation`:
    /// direct while warming up, captured on the execution after [`WARMUP_RUNS`],
    /// replayed after that. A generation other than the last one seen drops every
    /// capture first. A failed capture or replay is an error, never a silent direct run.
    pub fn run<L: Launcher<Graph = G>>(
        &mut self,
        launcher: &mut L,
        generation: u64,
        key: SplitKey,
    ) -> Result<Mode, String> {
        if key.cmds.is_empty() {
            return Ok(Mode::Direct);
        }
        if !self.enabled {
            launcher.direct(&key.cmds)?;
            return Ok(Mode::Direct);
        }
        if generation != self.generation {
            self.slots.clear();
            self.generation = generation;
        }
        if !self.slots.contains_key(&key) && self.slots.len() >= MAX_SPLITS {
            self.slots.clear();
        }
        match self.slots.get_mut(&key) {
            None => {
                launcher.direct(&key.cmds)?;
                self.slots.insert(key, Slot::Warm(1));
                Ok(Mode::Direct)
            }
            Some(Slot::Warm(n)) if *n < WARMUP_RUNS => {
                launcher.direct(&key.cmds)?;
                *n += 1;
                Ok(Mode::Direct)
            }
            Some(slot @ Slot::Warm(_)) => {
                let graph = launcher.capture(&key.cmds)?;
                launcher.replay(&graph)?;
                *slot = Slot::Ready(graph);
                Ok(Mode::Capture)
            }
            Some(Slot::Ready(graph)) => {
                launcher.replay(graph)?;
                Ok(Mode::Replay)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    /// Records what it was asked to do; graphs report their own destruction.
    #[derive(Default)]
    struct Mock {
        log: Vec<String>,
        dropped: Rc<RefCell<Vec<usize>>>,
        fail_capture: bool,
        next: usize,
    }

    struct MockGraph {
        id: usize,
        cmds: usize,
        dropped: Rc<RefCell<Vec<usize>>>,
    }

    impl Drop for MockGraph {
        fn drop(&mut self) {
            self.dropped.borrow_mut().push(self.id);
        }
    }

    impl Launcher for Mock {
        type Graph = MockGraph;
        fn direct(&mut self, cmds: &[Cmd]) -> Result<(), String> {
            self.log.push(format!("direct {}", cmds.len()));
            Ok(())
        }
        fn capture(&mut self, cmds: &[Cmd]) -> Result<MockGraph, String> {
            if self.fail_capture {
                return Err("capture refused".into());
            }
            self.next += 1;
            self.log.push(format!("capture g{}", self.next));
            Ok(MockGraph {
                id: self.next,
                cmds: cmds.len(),
                dropped: Rc::clone(&self.dropped),
            })
        }
        fn replay(&mut self, g: &MockGraph) -> Result<(), String> {
            self.log.push(format!("replay g{} ({})", g.id, g.cmds));
            Ok(())
        }
    }

    fn key(first: usize, n: usize) -> SplitKey {
        SplitKey {
            nodes: (first, first + n),
            cmds: (0..n)
                .map(|i| Cmd::Zero {
                    dst: first + i,
                    len: 1,
                })
                .collect(),
        }
    }

    #[test]
    fn two_warm_ups_then_capture_on_the_third_then_replay() {
        let mut c = ReplayCache::new(true);
        let mut m = Mock::default();
        let modes: Vec<Mode> = (0..5)
            .map(|_| c.run(&mut m, 0, key(3, 2)).unwrap())
            .collect();
        assert_eq!(
            modes,
            [
                Mode::Direct,
                Mode::Direct,
                Mode::Capture,
                Mode::Replay,
                Mode::Replay
            ]
        );
        assert_eq!(
            m.log,
            [
                "direct 2",
                "direct 2",
                "capture g1",
                "replay g1 (2)",
                "replay g1 (2)",
                "replay g1 (2)"
            ]
        );
        assert_eq!(c.captured(), 1);
    }

    #[test]
    fn splits_warm_up_and_capture_independently() {
        let mut c = ReplayCache::new(true);
        let mut m = Mock::default();
        for _ in 0..3 {
            c.run(&mut m, 0, key(0, 1)).unwrap();
        }
        assert_eq!(c.run(&mut m, 0, key(5, 1)).unwrap(), Mode::Direct);
        assert_eq!(c.run(&mut m, 0, key(0, 1)).unwrap(), Mode::Replay);
        // Same node range, different work (another graph's buffers): its own slot.
        let mut other = key(0, 1);
        other.cmds = vec![Cmd::Zero { dst: 99, len: 1 }];
        assert_eq!(c.run(&mut m, 0, other).unwrap(), Mode::Direct);
        assert_eq!(c.captured(), 1);
    }

    #[test]
    fn a_new_pool_generation_drops_every_capture_and_warms_up_again() {
        let mut c = ReplayCache::new(true);
        let mut m = Mock::default();
        for _ in 0..4 {
            c.run(&mut m, 7, key(0, 3)).unwrap();
        }
        assert!(m.dropped.borrow().is_empty());
        let modes: Vec<Mode> = (0..4)
            .map(|_| c.run(&mut m, 8, key(0, 3)).unwrap())
            .collect();
        assert_eq!(
            m.dropped.borrow().as_slice(),
            [1],
            "the stale graph is destroyed"
        );
        assert_eq!(
            modes,
            [Mode::Direct, Mode::Direct, Mode::Capture, Mode::Replay]
        );
        assert!(m.log.contains(&"capture g2".to_string()));
    }

    #[test]
    fn disabled_replay_always_launches_directly() {
        let mut c = ReplayCache::new(false);
        let mut m = Mock::default();
        for _ in 0..5 {
            assert_eq!(c.run(&mut m, 0, key(0, 2)).unwrap(), Mode::Direct);
        }
        assert_eq!(m.log, vec!["direct 2"; 5]);
        assert_eq!(c.captured(), 0);
    }

    #[test]
    fn a_failed_capture_is_an_error_not_a_direct_run() {
        let mut c = ReplayCache::new(true);
        let mut m = Mock::default();
        c.run(&mut m, 0, key(0, 1)).unwrap();
        c.run(&mut m, 0, key(0, 1)).unwrap();
        m.fail_capture = true;
        let e = c.run(&mut m, 0, key(0, 1)).unwrap_err();
        assert!(e.contains("capture refused"), "{e}");
        assert_eq!(m.log.len(), 2, "nothing ran in its place");
    }

    #[test]
    fn empty_splits_do_nothing_and_the_table_is_bounded() {
        let mut c: ReplayCache<MockGraph> = ReplayCache::new(true);
        let mut m = Mock::default();
        let empty = SplitKey {
            nodes: (0, 0),
            cmds: vec![],
        };
        assert_eq!(c.run(&mut m, 0, empty).unwrap(), Mode::Direct);
        assert!(m.log.is_empty());
        for i in 0..MAX_SPLITS + 10 {
            c.run(&mut m, 0, key(i, 1)).unwrap();
        }
        assert!(c.slots.len() <= MAX_SPLITS);
        c.invalidate();
        assert_eq!(c.slots.len(), 0);
    }
}
