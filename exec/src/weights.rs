//! The weights on their devices: every weight mapped in place on the CPU, or copied to the card
//! with routed experts placed as the plan says (compacted card stacks, host experts read from
//! the mapped file, streamed or paged from disk), which makes the [`ExpertTier`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bloomery_devices::bytes::i32_bytes;
use bloomery_devices::pages::{page_size, whole_pages};
use bloomery_devices::{Buffer, Device, KernelPluginFile};
use bloomery_gguf::{GgufModel, ModelTensor};
use bloomery_plugin_api::kernel::DeviceConfig;
use bloomery_plugin_api::model::{ModelSpec, WeightClass, WeightDecl};
use bloomery_plugin_api::tensor::TensorRef;
use bloomery_plugin_api::{DType, PluginError};
use bloomery_tiering::arena::StackSource;
use bloomery_tiering::bus_balance::BusBalance;
use bloomery_tiering::disk::disk_tier;
use bloomery_tiering::lending::Lending;
use bloomery_tiering::plan::{Plan, TierRequest};
use bloomery_tiering::residency::{LayerResidency, Residency};
use bloomery_tiering::{stream_set, ExpertTier, HostSlice, PeerPart, TierLayer};

use crate::error::{device_err, ModelError};
use crate::progress::{LoadStage, Stage};

/// The file tensor behind declared weight `name`, with its shape and contiguous strides; a
/// missing tensor is the plugin's named error.
pub fn weight_tensor<'f>(
    file: &'f GgufModel,
    spec: &ModelSpec,
    name: &str,
) -> Result<(&'f ModelTensor, [u64; 4], [u64; 4]), ModelError> {
    let t = file.tensor(name).ok_or_else(|| ModelError::Plugin {
        path: file.parts()[0].path().display().to_string(),
        plugin: spec.architecture.to_string(),
        error: PluginError::MissingTensor { name: name.into() },
    })?;
    let mut ne = [1u64; 4];
    for (d, &x) in t.info.shape.iter().take(4).enumerate() {
        ne[d] = x;
    }
    let nb = TensorRef::contiguous_strides(t.info.dtype, ne).ok_or_else(|| {
        ModelError::Request(format!("tensor `{}` has no valid layout", t.info.name))
    })?;
    Ok((t, ne, nb))
}

/// Maps each file part once and resolves every declared weight into it.
pub fn map_weights(
    device: &Arc<Device>,
    file: &GgufModel,
    spec: &ModelSpec,
) -> Result<(Vec<Buffer>, Vec<TensorRef>), ModelError> {
    let mut buffers = Vec::new();
    let total = file.parts().iter().map(|p| p.bytes().len() as u64).sum();
    let stage = Stage::begin(LoadStage::Mapped, total);
    for part in file.parts() {
        let bytes = part.bytes();
        // SAFETY: the mapping lives in `LoadedModel::file`, which is dropped after the buffers
        // (field order), and the file is mapped read-only and never written.
        let buf = unsafe { device.map_host(bytes.as_ptr(), bytes.len() as u64) }
            .map_err(device_err("mapping the model file"))?;
        buffers.push(buf);
        stage.advance(bytes.len() as u64);
    }
    drop(stage);
    let mut refs = Vec::with_capacity(spec.weights.len());
    for w in spec.weights.iter() {
        let (t, ne, nb) = weight_tensor(file, spec, w.name.as_str())?;
        refs.push(TensorRef {
            buffer: buffers[t.part].handle,
            offset: t.info.start,
            dtype: t.info.dtype,
            ne,
            nb,
        });
    }
    Ok((buffers, refs))
}

/// The weights on a card: as [`map_weights`] (each file part copied whole) for a model without
/// hashed n-gram tables; with them, every other weight copied into one allocation and the
/// tables left out (their references point nowhere: the host gathers their rows, and no graph
/// reads them).
pub fn copy_weights(
    card: &Arc<Device>,
    file: &GgufModel,
    spec: &ModelSpec,
) -> Result<(Vec<Buffer>, Vec<TensorRef>), ModelError> {
    let is_table = |w: &WeightDecl| w.class == WeightClass::NgramTable;
    if !spec.weights.iter().any(is_table) {
        return map_weights(card, file, spec);
    }
    let mut at = Vec::with_capacity(spec.weights.len());
    let mut packed = 0u64;
    for w in spec.weights.iter() {
        let (t, _, _) = weight_tensor(file, spec, w.name.as_str())?;
        at.push(packed);
        if !is_table(w) {
            packed += t.info.size.div_ceil(WEIGHT_ALIGN) * WEIGHT_ALIGN;
        }
    }
    let arena = card
        .alloc(packed)
        .map_err(device_err("allocating the card's weights"))?;
    let copied = Stage::begin(LoadStage::CopiedToCard, packed);
    let mut refs = Vec::with_capacity(spec.weights.len());
    for (w, &offset) in spec.weights.iter().zip(&at) {
        let (t, ne, nb) = weight_tensor(file, spec, w.name.as_str())?;
        let mut r = TensorRef {
            buffer: 0,
            offset: 0,
            dtype: t.info.dtype,
            ne,
            nb,
        };
        if !is_table(w) {
            let data = file.tensor_data(t)?;
            card.write(&arena, offset, data)
                .map_err(device_err("copying weights to the card"))?;
            copied.advance(data.len() as u64);
            (r.buffer, r.offset) = (arena.handle, offset);
        }
        refs.push(r);
    }
    Ok((vec![arena], refs))
}

/// Alignment of each weight in the card's one weight allocation (the kernels' widest loads
/// want 16 bytes; 256 as the driver aligns allocations).
const WEIGHT_ALIGN: u64 = 256;

/// Page-locks `ranges` of the file mapping (the host's reads: the stacks a prompt streams to
/// the card and the tables the card reads in place, [`ExpertTier::host_read`]), rounded to whole
/// pages, so the copies run at bus speed rather than through the driver's bounce buffer. Failure
/// is logged and false returned: the copies then stay pageable, and the card cannot read the
/// tables in place.
fn pin_streamed(card: &Device, ranges: &[(usize, usize)]) -> bool {
    let pages = whole_pages(ranges, page_size());
    let stage = Stage::begin(
        LoadStage::Pinned,
        pages.iter().map(|(lo, hi)| (hi - lo) as u64).sum(),
    );
    for (lo, hi) in pages {
        // SAFETY: every range lies in the model's read-only file mapping (rounded to the pages
        // it occupies), which outlives the card device (LoadedModel's field order).
        if let Err(e) = unsafe { card.pin_host(lo as *const u8, (hi - lo) as u64) } {
            tracing::warn!("page-locking host experts failed ({e}); prompts copy them pageable");
            return false;
        }
        stage.advance((hi - lo) as u64);
    }
    true
}

/// Gives each layer the card's in-place views of its page-locked stacks (the bus share of
/// decode's host experts); returns the views. Where the card cannot read host memory it logs
/// once and leaves every layer without them (the CPU then computes all host experts).
fn bus_views(card: &Arc<Device>, layers: &mut [TierLayer]) -> Vec<Buffer> {
    let mut views = Vec::new();
    for l in layers.iter_mut() {
        for (slice, full) in &l.stream {
            // SAFETY: the slice lies in the model's read-only file mapping, page-locked by
            // pin_streamed, which outlives the card device (LoadedModel's field order).
            match unsafe { card.map_pinned(slice.addr as *const u8, slice.len as u64) } {
                Ok(v) => {
                    l.bus_stacks.push(v.tensor(*full));
                    views.push(v);
                }
                Err(e) => {
                    tracing::warn!(
                        "the card cannot read host experts in place ({e}); the CPU computes them all"
                    );
                    layers.iter_mut().for_each(|l| l.bus_stacks.clear());
                    return Vec::new();
                }
            }
        }
    }
    views
}

/// Maps every part of `file` on `device` (`what` names it in errors).
fn map_file(device: &Arc<Device>, file: &GgufModel, what: &str) -> Result<Vec<Buffer>, ModelError> {
    let mut buffers = Vec::new();
    let mapped = Stage::begin(
        LoadStage::Mapped,
        file.parts().iter().map(|p| p.bytes().len() as u64).sum(),
    );
    for part in file.parts() {
        let bytes = part.bytes();
        // SAFETY: the mapping lives in `LoadedModel::file`, which is dropped after the tier
        // (field order), and the file is mapped read-only and never written.
        let buf = unsafe { device.map_host(bytes.as_ptr(), bytes.len() as u64) }
            .map_err(device_err(what))?;
        buffers.push(buf);
        mapped.advance(bytes.len() as u64);
    }
    Ok(buffers)
}

/// Loads the weights as `plan` places them: every weight on `card`, routed-expert stacks
/// compacted to their on-card experts; the file mapped on a device of `host_kernel` for the host
/// experts, and on `peer` for the experts the plan puts on a second card (it computes them from
/// the file in place: a CPU device standing in for that card). Returns the card buffers, the
/// card's weight table (in `spec` order) and the tier.
#[allow(clippy::too_many_arguments)]
pub fn load_tiered(
    card: &Arc<Device>,
    host_kernel: &KernelPluginFile,
    peer: Option<Arc<Device>>,
    threads: u32,
    file: &GgufModel,
    spec: &ModelSpec,
    plan: &Plan,
    request: &TierRequest,
) -> Result<(Vec<Buffer>, Vec<TensorRef>, ExpertTier), ModelError> {
    let peers = plan.has_peer_experts();
    if plan.peers.len() > 1 && peers {
        return Err(ModelError::Request(format!(
            "routed experts on {} cards after the main one: one is implemented",
            plan.peers.len()
        )));
    }
    let peer = match (peer, peers) {
        (Some(p), true) => Some(p),
        (None, true) => {
            return Err(ModelError::Request(
                "the plan puts experts on a second card, and no device computes them".into(),
            ))
        }
        (_, false) => None,
    };
    if peers && plan.host_expert_bytes() > plan.host_budget {
        return Err(ModelError::Request(
            "experts on a second card with the disk tier: not implemented (raise \
             --host-budget)"
                .into(),
        ));
    }
    let host = Device::open(
        host_kernel,
        DeviceConfig {
            index: 0,
            threads,
            pin_threads: true,
        },
    )
    .map_err(device_err("opening the host experts' CPU device"))?;
    let mut host_buffers = map_file(&host, file, "mapping the model file for host experts")?;
    let mut peer_buffers = match &peer {
        Some(p) => map_file(
            p,
            file,
            "mapping the model file for the second card's experts",
        )?,
        None => Vec::new(),
    };
    // weight index → (layer, position among its stacks)
    let mut stack_of: HashMap<usize, (usize, usize)> = HashMap::new();
    for (li, l) in plan.layers.iter().enumerate() {
        for (k, &w) in l.stacks.iter().enumerate() {
            stack_of.insert(w, (li, k));
        }
    }
    let mut card_buffers = Vec::new();
    let mut weights = Vec::with_capacity(spec.weights.len());
    let mut host_stacks: Vec<Vec<TensorRef>> = vec![Vec::new(); plan.layers.len()];
    let mut peer_stacks: Vec<Vec<TensorRef>> = vec![Vec::new(); plan.layers.len()];
    let mut stream: Vec<Vec<(HostSlice, TensorRef)>> = vec![Vec::new(); plan.layers.len()];
    let mut card_stacks: Vec<Vec<TensorRef>> = vec![Vec::new(); plan.layers.len()];
    let mut sources: Vec<Vec<StackSource>> = vec![Vec::new(); plan.layers.len()];
    // Each layer's stacks arrive in the order the model declares its weights; the MoE call names
    // them in its own (gate, up, down): the position of each among the call's.
    let mut positions: Vec<Vec<usize>> = vec![Vec::new(); plan.layers.len()];
    // Every weight the card holds lies in one allocation, at these offsets: the driver rounds
    // each allocation up to whole 2 MiB pages, and one allocation a tensor cost the 30B-A3B file
    // about 230 MiB of card memory with every expert on the host (docs/performance.md).
    let mut packed_at = vec![None; spec.weights.len()];
    let mut packed = 0u64;
    for (i, w) in spec.weights.iter().enumerate() {
        let (t, _, nb) = weight_tensor(file, spec, w.name.as_str())?;
        let bytes = match stack_of.get(&i) {
            None if plan.table_weights.contains(&i) => 0,
            // The hashed n-gram tables: the host gathers their rows (`ngram_table.rs`).
            None if w.class == WeightClass::NgramTable => 0,
            None => t.info.size,
            Some(&(li, _)) => plan.on_card[li].iter().filter(|&&c| c).count() as u64 * nb[2],
        };
        if bytes > 0 {
            packed_at[i] = Some(packed);
            packed += bytes.div_ceil(WEIGHT_ALIGN) * WEIGHT_ALIGN;
        }
    }
    let arena = card
        .alloc(packed)
        .map_err(device_err("allocating the card's weights"))?;
    let copied = Stage::begin(LoadStage::CopiedToCard, packed);
    // The tables left in host RAM: weight index and bytes, given views once page-locked.
    let mut tables: Vec<(usize, HostSlice)> = Vec::new();
    for (i, w) in spec.weights.iter().enumerate() {
        let (t, ne, nb) = weight_tensor(file, spec, w.name.as_str())?;
        let data = file.tensor_data(t)?;
        let at = packed_at[i].unwrap_or(0);
        if w.class == WeightClass::NgramTable && !stack_of.contains_key(&i) {
            weights.push(TensorRef {
                buffer: 0,
                offset: 0,
                dtype: t.info.dtype,
                ne,
                nb,
            });
            continue;
        }
        if plan.table_weights.contains(&i) && !stack_of.contains_key(&i) {
            tables.push((i, HostSlice::of(data)));
            weights.push(TensorRef {
                buffer: 0,
                offset: 0,
                dtype: t.info.dtype,
                ne,
                nb,
            });
            continue;
        }
        let Some(&(li, k)) = stack_of.get(&i) else {
            card.write(&arena, at, data)
                .map_err(device_err("copying weights to the card"))?;
            copied.advance(data.len() as u64);
            // The host never reads a weight the card holds: its pages leave resident memory,
            // which then holds what the host budget plans for (docs/performance.md).
            HostSlice::of(data).release();
            weights.push(TensorRef {
                buffer: arena.handle,
                offset: at,
                dtype: t.info.dtype,
                ne,
                nb,
            });
            continue;
        };
        let full = TensorRef {
            buffer: host_buffers[t.part].handle,
            offset: t.info.start,
            dtype: t.info.dtype,
            ne,
            nb,
        };
        positions[li].push(k);
        host_stacks[li].push(full);
        if let Some(b) = peer_buffers.get(t.part) {
            peer_stacks[li].push(TensorRef {
                buffer: b.handle,
                ..full
            });
        }
        sources[li].push(StackSource {
            part: t.part,
            offset: t.info.start,
            stride: nb[2],
        });
        stream[li].push((HostSlice::of(data), full));
        let on_card: Vec<usize> = (0..ne[2] as usize)
            .filter(|&e| plan.on_card[li][e])
            .collect();
        let compact = [ne[0], ne[1], on_card.len() as u64, 1];
        let cnb = TensorRef::contiguous_strides(t.info.dtype, compact).ok_or_else(|| {
            ModelError::Request(format!("tensor `{}` has no valid layout", t.info.name))
        })?;
        let mut r = TensorRef {
            buffer: 0,
            offset: 0,
            dtype: t.info.dtype,
            ne: compact,
            nb: cnb,
        };
        if !on_card.is_empty() {
            let stride = nb[2] as usize;
            for (j, &e) in on_card.iter().enumerate() {
                card.write(
                    &arena,
                    at + (j * stride) as u64,
                    &data[e * stride..][..stride],
                )
                .map_err(device_err("copying experts to the card"))?;
                copied.advance(stride as u64);
            }
            r.buffer = arena.handle;
            r.offset = at;
            if on_card.len() as u64 == ne[2] {
                // A layer whole on the card is not a tier layer: nothing streams its stacks.
                HostSlice::of(data).release();
            }
        }
        card_stacks[li].push(r);
        weights.push(r);
    }
    card_buffers.push(arena);
    let mut layers = Vec::new();
    let mut layer_sources = Vec::new();
    let mut routing = Vec::new();
    // The tier layers lent a staging set.
    let mut lent = Vec::new();
    for (li, l) in plan.layers.iter().enumerate() {
        let here = &plan.on_card[li];
        if here.iter().all(|&c| c) {
            continue;
        }
        if plan.lent.contains(&li) {
            lent.push(layers.len());
        }
        let mut next = 0;
        let card_map: Vec<i32> = here
            .iter()
            .map(|&c| {
                if c {
                    next += 1;
                    next - 1
                } else {
                    -1
                }
            })
            .collect();
        let host_map: Vec<i32> = (0..here.len())
            .map(|e| if plan.on_host(li, e) { e as i32 } else { -1 })
            .collect();
        let map_ref = |buf: &Buffer| TensorRef {
            buffer: buf.handle,
            offset: 0,
            dtype: DType::I32,
            ne: [u64::from(l.n_expert), 1, 1, 1],
            nb: [
                4,
                4 * u64::from(l.n_expert),
                4 * u64::from(l.n_expert),
                4 * u64::from(l.n_expert),
            ],
        };
        let cbuf = card
            .alloc(4 * u64::from(l.n_expert))
            .map_err(device_err("allocating an expert map"))?;
        card.write(&cbuf, 0, i32_bytes(&card_map))
            .map_err(device_err("writing an expert map"))?;
        let hbuf = host
            .alloc(4 * u64::from(l.n_expert))
            .map_err(device_err("allocating an expert map"))?;
        host.write(&hbuf, 0, i32_bytes(&host_map))
            .map_err(device_err("writing an expert map"))?;
        let order = &positions[li];
        let peer_part = match (&peer, plan.peers.first()) {
            (Some(p), Some(held)) if held.experts[li].iter().any(|&x| x) => {
                let map: Vec<i32> = (0..here.len())
                    .map(|e| if held.experts[li][e] { e as i32 } else { -1 })
                    .collect();
                let buf = p
                    .alloc(4 * u64::from(l.n_expert))
                    .map_err(device_err("allocating an expert map"))?;
                p.write(&buf, 0, i32_bytes(&map))
                    .map_err(device_err("writing an expert map"))?;
                let part = PeerPart {
                    stacks: in_call_order(std::mem::take(&mut peer_stacks[li]), order),
                    map: map_ref(&buf),
                };
                peer_buffers.push(buf);
                Some(part)
            }
            _ => None,
        };
        layers.push(TierLayer {
            first_stack: l.stacks[0],
            n_card: next as u32,
            card_map: map_ref(&cbuf),
            host_stacks: in_call_order(std::mem::take(&mut host_stacks[li]), order),
            host_map: map_ref(&hbuf),
            stream: in_call_order(std::mem::take(&mut stream[li]), order),
            card_stacks: in_call_order(std::mem::take(&mut card_stacks[li]), order),
            bus_stacks: Vec::new(),
            peer: peer_part,
            part_maps: Vec::new(),
        });
        layer_sources.push(in_call_order(std::mem::take(&mut sources[li]), order));
        let on_card: Vec<u32> = (0..l.n_expert).filter(|&e| here[e as usize]).collect();
        routing.push(LayerResidency::new(l.n_expert as usize, &on_card));
        card_buffers.push(cbuf);
        host_buffers.push(hbuf);
    }
    let mut bus = Vec::new();
    let on_disk = plan.host_expert_bytes() > plan.host_budget && !layers.is_empty();
    // With the disk tier only the tables (prompts stream its experts from the mapping; the plan
    // puts the tables here only when the card cannot hold them).
    let host_read: Vec<(usize, usize)> = layers
        .iter()
        .filter(|_| !on_disk)
        .flat_map(|l| l.stream.iter().map(|(h, _)| h))
        .chain(tables.iter().map(|(_, h)| h))
        .map(|h| (h.addr, h.addr + h.len))
        .collect();
    drop(copied);
    let pinned = pin_streamed(card, &host_read);
    let disk = if on_disk {
        Some(Arc::new(disk_tier(
            &host,
            file,
            plan,
            &mut layers,
            layer_sources,
            request.disk_prefetch,
        )?))
    } else {
        // The bus share and residency move host experts by the card's map alone, which does
        // not know the second card's: both stay off with experts there.
        if pinned && request.bus_experts != Some(0) && !peers {
            bus = bus_views(card, &mut layers);
        }
        None
    };
    for (i, slice) in tables {
        let r = &mut weights[i];
        // SAFETY: the slice lies in the model's read-only file mapping, page-locked above, which
        // outlives the card device (LoadedModel's field order).
        match unsafe { card.map_pinned(slice.addr as *const u8, slice.len as u64) } {
            Ok(v) => {
                r.buffer = v.handle;
                bus.push(v);
            }
            Err(e) => {
                // The plan left no room for it, so the card may run short later.
                tracing::warn!(
                    "the card cannot read `{}` in place ({e}); it is copied to the card, {:.1} \
                     MiB past the plan",
                    spec.weights[i].name,
                    slice.len as f64 / (1u64 << 20) as f64
                );
                let buf = card
                    .alloc(slice.len as u64)
                    .map_err(device_err("allocating a token table on the card"))?;
                card.write(&buf, 0, slice.bytes())
                    .map_err(device_err("copying a token table to the card"))?;
                r.buffer = buf.handle;
                card_buffers.push(buf);
            }
        }
    }
    let mut staging = Vec::new();
    for _ in 0..plan.staging_sets {
        let mut set = Vec::new();
        for k in 0..layers.iter().map(|l| l.stream.len()).max().unwrap_or(0) {
            let bytes = layers
                .iter()
                .filter_map(|l| l.stream.get(k).map(|(h, _)| h.len as u64))
                .max()
                .unwrap_or(0);
            set.push(
                card.alloc(bytes)
                    .map_err(device_err("allocating the experts' staging buffers"))?,
            );
        }
        staging.push(set);
    }
    let parts = plan.staging_parts();
    if parts > 1 && !layers.is_empty() {
        card_buffers.push(part_maps(card, &mut layers, parts)?);
    }
    let mut sets = vec![None; staging.len()];
    for t in lent {
        let set = stream_set(t, staging.len());
        let copies = layers[t]
            .stream
            .iter()
            .zip(staging.get(set).into_iter().flatten())
            .map(|((slice, _), b)| (b.handle, *slice))
            .collect();
        if let Some(s) = sets.get_mut(set) {
            *s = Some((t, copies));
        }
    }
    let lending = Arc::new(Lending::new(sets, disk.is_some()));
    Ok((
        card_buffers,
        weights,
        ExpertTier {
            layers,
            staging,
            staging_parts: parts,
            lending,
            residency: Arc::new(Mutex::new(Residency::new(
                routing,
                !request.no_residency && !peers,
            ))),
            disk,
            bus: Arc::new(Mutex::new(BusBalance::new(request.bus_experts))),
            bus_views: bus,
            host_read,
            peer_buffers,
            peer,
            host_buffers,
            host,
        },
    ))
}

/// A layer's per-stack entries `v`, gathered in the order the model declares its weights, in the
/// order its MoE call names the stacks (`order[i]`: entry `i`'s position among them).
fn in_call_order<T>(v: Vec<T>, order: &[usize]) -> Vec<T> {
    let mut placed: Vec<(usize, T)> = order.iter().copied().zip(v).collect();
    placed.sort_by_key(|&(k, _)| k);
    placed.into_iter().map(|(_, t)| t).collect()
}

/// Writes every layer's part maps ([`TierLayer::part_maps`], `parts` each) into one card
/// buffer, which it returns.
fn part_maps(
    card: &Arc<Device>,
    layers: &mut [TierLayer],
    parts: usize,
) -> Result<Buffer, ModelError> {
    let mut maps: Vec<i32> = Vec::new();
    for l in layers.iter() {
        let n = l.card_map.ne[0] as usize;
        for p in 0..parts {
            let (lo, hi) = (n * p / parts, n * (p + 1) / parts);
            maps.extend((0..n).map(|e| if (lo..hi).contains(&e) { e as i32 } else { -1 }));
        }
    }
    let buf = card
        .alloc(4 * maps.len() as u64)
        .map_err(device_err("allocating the experts' part maps"))?;
    card.write(&buf, 0, i32_bytes(&maps))
        .map_err(device_err("writing the experts' part maps"))?;
    let mut offset = 0;
    for l in layers.iter_mut() {
        let like = l.card_map;
        for _ in 0..parts {
            l.part_maps.push(TensorRef {
                buffer: buf.handle,
                offset,
                ..like
            });
            offset += like.ne[0] * 4;
        }
    }
    Ok(buf)
}
