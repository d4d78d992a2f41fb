//! The wgpu backend's device plumbing: pool and scratch buffers, the one open command
//! encoder, pipelines and cached bind groups, dispatch, uploads, snapshots and
//! readback. The op files record their kernels through `dispatch`.

use minfer_graph::device_kit::NodeBufs;
use minfer_graph::BackendError;
use wgpu::util::DeviceExt;

use super::res::{grid, u32_of, BindKey, Res, BIND_GROUP_CACHE, PARAMS};
use super::WgpuBackend;
use crate::kernels::{Bind, Kernel};

impl WgpuBackend {
    pub(super) fn new_buffer(&self, len: usize) -> wgpu::Buffer {
        self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            // A binding may not be empty: a zero-length buffer still gets one word.
            size: (len.max(1) * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    pub(super) fn encoder(&mut self) -> &mut wgpu::CommandEncoder {
        let device = &self.gpu.device;
        self.encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
        })
    }

    pub(super) fn take_errors(&self) -> Result<(), BackendError> {
        let mut e = self
            .errors
            .lock()
            .map_err(|_| "device error log poisoned".to_string())?;
        if e.is_empty() {
            return Ok(());
        }
        let msg = e.join("; ");
        e.clear();
        Err(BackendError::device(format!(
            "the wgpu device reported: {msg}"
        )))
    }

    pub(super) fn submit(&mut self) {
        if let Some(enc) = self.encoder.take() {
            self.gpu.queue.submit([enc.finish()]);
        }
    }

    pub(super) fn wait(&self) -> Result<(), BackendError> {
        self.count_wait();
        self.gpu
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .map(|_| ())
            .map_err(|e| BackendError::device(format!("waiting for the device failed: {e}")))
    }

    /// Reads a whole pool buffer back to the host.
    pub(super) fn readback(&mut self, id: usize) -> Result<Vec<f32>, BackendError> {
        let len = self
            .pool
            .bufs
            .get(id)
            .ok_or_else(|| format!("buffer {id} does not exist"))?
            .len;
        self.readback_window(id, 0, len)
    }

    /// Reads values `offset..offset + len` of a pool buffer back to the host.
    pub(super) fn readback_window(
        &mut self,
        id: usize,
        offset: usize,
        len: usize,
    ) -> Result<Vec<f32>, BackendError> {
        let have = self
            .pool
            .bufs
            .get(id)
            .ok_or(BackendError::NoSuchBuffer { id })?
            .len;
        if offset.checked_add(len).is_none_or(|end| end > have) {
            return Err(BackendError::Window {
                id,
                offset,
                len,
                buf_len: have,
            });
        }
        // A copy may not be empty: an empty window still moves one word.
        let bytes = (len.max(1) * 4) as u64;
        let src_off = (offset.min(have.saturating_sub(1)) * 4) as u64;
        let staging = self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let src = self.pool.bufs[id].mem.clone();
        self.encoder()
            .copy_buffer_to_buffer(&src, src_off, &staging, 0, bytes);
        self.submit();
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.wait()?;
        rx.recv()
            .map_err(|_| "readback callback never ran".to_string())?
            .map_err(|e| format!("mapping the readback failed: {e}"))?;
        let out = {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| format!("reading the readback failed: {e}"))?;
            let mut out = vec![0f32; len];
            bytemuck::cast_slice_mut::<f32, u8>(&mut out).copy_from_slice(&view[..len * 4]);
            out
        };
        staging.unmap();
        self.take_errors()?;
        Ok(out)
    }

    pub(super) fn resource(&mut self, r: Res) -> Result<wgpu::Buffer, BackendError> {
        Ok(match r {
            Res::Pool(id) => self
                .pool
                .bufs
                .get(id)
                .ok_or_else(|| format!("buffer {id} does not exist"))?
                .mem
                .clone(),
            Res::Weight(i) => self
                .weights
                .mem
                .get(i)
                .ok_or_else(|| format!("weight buffer {i} does not exist"))?
                .clone(),
            Res::Snap(len) => {
                if !self.snapshots.contains_key(&len) {
                    let b = self.new_buffer(len);
                    self.snapshots.insert(len, b);
                }
                self.snapshots[&len].clone()
            }
            Res::Act(len) => {
                if !self.act_scratch.contains_key(&len) {
                    let b = self.new_buffer(len);
                    self.act_scratch.insert(len, b);
                }
                self.act_scratch[&len].clone()
            }
            Res::Tmp(slot, len) => {
                if !self.tmp_scratch.contains_key(&(slot, len)) {
                    let b = self.new_buffer(len);
                    self.tmp_scratch.insert((slot, len), b);
                }
                self.tmp_scratch[&(slot, len)].clone()
            }
        })
    }

    pub(super) fn pipeline(&mut self, k: Kernel) -> Result<(), BackendError> {
        if self.pipelines.contains_key(&k) {
            return Ok(());
        }
        let (src, entry, binds) = k.spec()?;
        let device = &self.gpu.device;
        let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(entry),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
        let entries: Vec<wgpu::BindGroupLayoutEntry> = binds
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupLayoutEntry {
                binding: i as u32,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: match b {
                    Bind::Uniform => wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    Bind::Ro | Bind::Rw => wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Storage {
                            read_only: *b == Bind::Ro,
                        },
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                },
                count: None,
            })
            .collect();
        let bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(entry),
            entries: &entries,
        });
        let layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(entry),
            bind_group_layouts: &[Some(&bgl)],
            immediate_size: 0,
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(entry),
            layout: Some(&layout),
            module: &module,
            entry_point: Some(entry),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(format!("kernel {k:?} does not compile: {e}").into());
        }
        self.pipelines.insert(k, (pipeline, bgl));
        Ok(())
    }

    /// Records one dispatch of `k` over `res` (in binding order, the uniform block last).
    pub(super) fn dispatch(
        &mut self,
        k: Kernel,
        res: &[Res],
        params: &[u32],
        groups: (u32, u32, u32),
    ) -> Result<(), BackendError> {
        if params.len() > PARAMS {
            return Err(format!(
                "{} kernel parameters, the block holds {PARAMS}",
                params.len()
            )
            .into());
        }
        let mut block = [0u32; PARAMS];
        block[..params.len()].copy_from_slice(params);
        let params = block;
        self.pipeline(k)?;
        let key: BindKey = (k, res.to_vec(), params);
        if !self.bind_groups.contains_key(&key) {
            if self.bind_groups.len() >= BIND_GROUP_CACHE {
                self.bind_groups.clear();
            }
            let mut bufs = Vec::with_capacity(res.len() + 1);
            for &r in res {
                bufs.push(self.resource(r)?);
            }
            let uniform = self
                .gpu
                .device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("params"),
                    contents: bytemuck::cast_slice(&params),
                    usage: wgpu::BufferUsages::UNIFORM,
                });
            bufs.push(uniform);
            let entries: Vec<wgpu::BindGroupEntry> = bufs
                .iter()
                .enumerate()
                .map(|(i, b)| wgpu::BindGroupEntry {
                    binding: i as u32,
                    resource: b.as_entire_binding(),
                })
                .collect();
            let (_, bgl) = &self.pipelines[&k];
            let bg = self
                .gpu
                .device
                .create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: bgl,
                    entries: &entries,
                });
            self.bind_groups.insert(key.clone(), bg);
        }
        let pipeline = self.pipelines[&k].0.clone();
        let bg = self.bind_groups[&key].clone();
        let enc = self.encoder();
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: None,
        });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bg, &[]);
        pass.dispatch_workgroups(groups.0, groups.1, groups.2);
        Ok(())
    }

    /// Element-wise dispatch over `n` outputs in workgroups of 256.
    pub(super) fn elementwise(
        &mut self,
        k: Kernel,
        res: &[Res],
        n: usize,
        nb: usize,
    ) -> Result<(), BackendError> {
        self.elementwise_with(k, res, n, nb, [0.0; 2])
    }

    /// [`Self::elementwise`] with the kernel's two f32 constants (the third and fourth
    /// words of its parameter block: a scale, or a soft-cap and its reciprocal).
    pub(super) fn elementwise_with(
        &mut self,
        k: Kernel,
        res: &[Res],
        n: usize,
        nb: usize,
        consts: [f32; 2],
    ) -> Result<(), BackendError> {
        let (gx, gy) = grid(n.div_ceil(256))?;
        let p = [
            u32_of(n, "elements")?,
            u32_of(nb.max(1), "elements")?,
            consts[0].to_bits(),
            consts[1].to_bits(),
        ];
        self.dispatch(k, res, &p, (gx, gy, 1))
    }

    /// Records the copy of `data` to `offset` of pool buffer `id` through a staging
    /// buffer, in order with the dispatches.
    pub(super) fn upload_staged(&mut self, id: usize, offset: usize, data: &[f32]) {
        let staging = self
            .gpu
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("upload"),
                contents: bytemuck::cast_slice(data),
                usage: wgpu::BufferUsages::COPY_SRC,
            });
        let dst = self.pool.bufs[id].mem.clone();
        self.encoder().copy_buffer_to_buffer(
            &staging,
            0,
            &dst,
            (offset * 4) as u64,
            (data.len() * 4) as u64,
        );
    }

    /// Length of pool buffer `id` (0 when there is none).
    pub(super) fn len(&self, id: usize) -> usize {
        self.pool.len(id)
    }

    /// Records a copy of all of pool buffer `id` into the snapshot of its length, and
    /// returns the snapshot: a kernel that reads an input which is also its output
    /// reads it there.
    pub(super) fn snapshot(&mut self, id: usize) -> Result<Res, BackendError> {
        let len = self.len(id);
        let snap = self.resource(Res::Snap(len))?;
        let b = self.pool.bufs[id].mem.clone();
        self.encoder()
            .copy_buffer_to_buffer(&b, 0, &snap, 0, (len.max(1) * 4) as u64);
        Ok(Res::Snap(len))
    }

    /// Source `i` of a node, from a snapshot when it is also the output.
    pub(super) fn src(&mut self, io: &NodeBufs, i: usize) -> Result<Res, BackendError> {
        let id = io.id(i)?;
        if id != io.out {
            return Ok(Res::Pool(id));
        }
        self.snapshot(id)
    }

    /// Length of source `i` of a node.
    pub(super) fn src_len(&self, io: &NodeBufs, i: usize) -> usize {
        io.len(i, &self.pool)
    }
}
