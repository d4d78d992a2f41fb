//! Recording and running a split on CUDA: launches checked against their kernel's
//! signature, the split's flush through the replay cache (direct, capture, replay),
//! and readback.

use std::sync::atomic::Ordering;

use minfer_graph::BackendError;

use super::{CudaBackend, PROCESS_STATS};
use crate::device::{DevLauncher, Pinned};
use crate::dispatch::Geom;
use crate::kernels::{Kernel, Param};
use crate::replay::{Arg, Cmd, Mode, SplitKey};

/// Whether `args` fit the kinds of `kernel`'s parameters, one for one.
pub(super) fn args_match(kernel: Kernel, args: &[Arg]) -> bool {
    let params = kernel.params();
    params.len() == args.len()
        && params.iter().zip(args).all(|(p, a)| match (p, a) {
            (Param::U32, Arg::U32(_)) | (Param::F32, Arg::F32(_)) => true,
            (Param::Ptr, Arg::U32(_) | Arg::F32(_)) => false,
            (Param::Ptr, _) => true,
            _ => false,
        })
}

/// `v` as a kernel argument, or an error naming `what` when it does not fit.
pub(super) fn u32_of(v: usize, what: &str) -> Result<u32, BackendError> {
    u32::try_from(v)
        .map_err(|_| format!("{what} {v} does not fit the kernels' 32-bit indices").into())
}

/// An f32 kernel argument.
pub(super) fn f32_arg(v: f32) -> Arg {
    Arg::F32(v.to_bits())
}

impl CudaBackend {
    /// Records a launch. Arguments that do not match the kernel's declared parameters
    /// (a dispatcher bug) fail the split at its flush, naming the kernel, instead of
    /// handing the device a wrong parameter block.
    pub(super) fn launch(&mut self, kernel: Kernel, geom: Geom, args: Vec<Arg>) {
        if self.bad_launch.is_none() && !args_match(kernel, &args) {
            self.bad_launch = Some(format!(
                "internal: {kernel:?} launched with {args:?}, its signature is {:?}",
                kernel.params()
            ));
        }
        self.pending.push(Cmd::Launch { kernel, geom, args });
    }

    /// Runs the recorded split through the replay cache and waits for the stream.
    pub(super) fn flush(&mut self) -> Result<(), BackendError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        if let Some(e) = self.bad_launch.take() {
            self.pending.clear();
            self.staged.clear();
            self.nodes = None;
            return Err(e.into());
        }
        self.gpu.bind()?;
        let cmds = std::mem::take(&mut self.pending);
        let staged = std::mem::take(&mut self.staged);
        // The split the scheduler opened; (0, 0) for work recorded outside one.
        let nodes = self.nodes.take().unwrap_or((0, 0));
        if !staged.is_empty() {
            if self.staging.as_ref().is_none_or(|p| p.len() < staged.len()) {
                self.staging = Some(Pinned::new(crate::device::staging_len(staged.len())?)?);
                self.bump();
            }
            if let Some(p) = self.staging.as_mut() {
                p.as_mut_slice()[..staged.len()].copy_from_slice(&staged);
            }
        }
        let mut launcher = DevLauncher {
            gpu: &self.gpu,
            bufs: self
                .pool
                .bufs
                .iter()
                .map(|b| b.mem.as_ref().map(|m| m.ptr))
                .collect(),
            weights: self.weights.mem.iter().map(|m| m.ptr).collect(),
            scratch: self.scratch.as_ref().map(|m| m.ptr),
            snaps: self.snaps.iter().map(|(&k, m)| (k, m.ptr)).collect(),
            staging: self.staging.as_ref(),
        };
        let key = SplitKey { nodes, cmds };
        let mode = self.replay.run(&mut launcher, self.generation, key)?;
        let slot = match mode {
            Mode::Direct => {
                self.stats.direct += 1;
                0
            }
            Mode::Capture => {
                self.stats.captured += 1;
                1
            }
            Mode::Replay => {
                self.stats.replayed += 1;
                2
            }
        };
        PROCESS_STATS[slot].fetch_add(1, Ordering::Relaxed);
        self.gpu.sync().map_err(BackendError::device)
    }

    /// [`Self::flush`], dropping what was recorded when it fails (it cannot run again).
    pub(super) fn flush_or_discard(&mut self) -> Result<(), BackendError> {
        let r = self.flush();
        if r.is_err() {
            self.pending.clear();
            self.staged.clear();
            self.nodes = None;
        }
        r
    }

    /// Runs what is recorded and reads buffer `id` back.
    pub(super) fn readback(&mut self, id: usize) -> Result<Vec<f32>, BackendError> {
        self.take_failure()?;
        self.gpu.bind()?;
        self.flush()?;
        let b = self
            .pool
            .bufs
            .get(id)
            .ok_or(BackendError::NoSuchBuffer { id })?;
        let ptr = b
            .mem
            .as_ref()
            .map(|m| m.ptr)
            .ok_or(BackendError::NoStorage { id })?;
        let mut out = vec![0f32; b.len];
        self.gpu
            .readback(ptr, &mut out, &mut self.readback)
            .map_err(BackendError::device)?;
        Ok(out)
    }

    /// The error of a split `synchronize` ran, once.
    pub(super) fn take_failure(&mut self) -> Result<(), BackendError> {
        match self.failed.take() {
            Some(e) => Err(format!("an earlier split failed: {e}").into()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_arguments_are_checked_against_the_kernel_signature() {
        let ok = [
            Arg::Buf(0),
            Arg::Weight(1),
            Arg::BufAt(2, 5),
            Arg::U32(3),
            Arg::U32(4),
        ];
        assert!(args_match(Kernel::Add, &ok));
        // A value where an address goes, a missing argument, a float for an integer.
        assert!(!args_match(
            Kernel::Add,
            &[Arg::U32(0), ok[1], ok[2], ok[3], ok[4]]
        ));
        assert!(!args_match(Kernel::Add, &ok[..4]));
        assert!(!args_match(
            Kernel::Add,
            &[ok[0], ok[1], ok[2], Arg::F32(0), ok[4]]
        ));
        let norm = [
            Arg::Buf(0),
            Arg::Buf(0),
            Arg::Snap(0, 8),
            Arg::U32(8),
            Arg::F32(0),
            Arg::U32(1),
        ];
        assert!(args_match(Kernel::RmsNorm, &norm));
    }
}
