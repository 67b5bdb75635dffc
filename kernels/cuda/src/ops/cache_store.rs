//! The K/V cache store (`cu/cache_store.cuh`): each row written at row `position % len` of its
//! slot in an f32, f16 or quantized cache (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL: blocks
//! quantized as llama.cpp's CUDA cache copies quantize them, `cu/kv_quant.cuh`, after the
//! Walsh-Hadamard rotation the op names), a block per row, slots and positions checked on the
//! card. The f32 and f16 stores that follow a per-head RMSNorm
//! and Rope go in their launch (`fused::norm_rope`).

use bloomery_plugin_api::op::{OpKind, OpSupport};
use bloomery_plugin_api::tensor::OpCall;
use bloomery_plugin_api::{DType, PluginError};

use super::{cfg, claim, driver_err, f32_only, Addr, Launcher, Src};

/// The `(op, dtypes)` pairs this family implements: every K/V cache type.
pub(super) fn claims() -> Vec<OpSupport> {
    vec![claim(OpKind::CacheStore, &KV_TYPES)]
}

/// The K/V cache types, in the order of their codes in `cu/kv_quant.cuh` (`KV_F32` = 0 ...).
pub(super) const KV_TYPES: [DType; 8] = [
    DType::F32,
    DType::F16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::IQ4_NL,
];

/// The `cu/kv_quant.cuh` code of cache type `t`, if it is one.
pub(super) fn kv_code(t: DType) -> Option<i32> {
    KV_TYPES.iter().position(|&k| k == t).map(|i| i as i32)
}

impl Launcher {
    /// Rows (source 0) into the cache (source 1, the call's destination) at their slots and
    /// positions (sources 2 and 3); a quantized cache's rows rotated in chunks of `rot` first
    /// (llama.cpp's Walsh-Hadamard rotation, `rotate.rs`; 0 = none).
    pub(super) fn cache_store<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
        rot: u32,
    ) -> Result<(), PluginError> {
        let (rows, cache, slots, pos) = (src(0)?, src(1)?, src(2)?, src(3)?);
        if *cache != c.dst {
            return Err(PluginError::invalid(
                "CacheStore must write the cache it names",
            ));
        }
        f32_only(rows, "CacheStore rows")?;
        let code = kv_code(cache.dtype).ok_or_else(|| {
            PluginError::unsupported(format!("CacheStore into {}", cache.dtype), &[])
        })?;
        let name = match cache.dtype {
            DType::F32 => "bl_cache_store_f32",
            DType::F16 => "bl_cache_store_f16",
            t if !cache.ne[0].is_multiple_of(32) => {
                return Err(PluginError::invalid(format!(
                    "CacheStore into a {t} cache of rows of {} values (a multiple of 32 needed)",
                    cache.ne[0]
                )))
            }
            _ => "bl_cache_store_quant",
        };
        let n = rows.rows();
        if rows.ne[0] != cache.ne[0] || slots.elements() != n || pos.elements() != n {
            return Err(PluginError::invalid("CacheStore shapes"));
        }
        let (mut pr, pc) = (addr(rows, "rows")?, addr(cache, "cache")?);
        if rot > 0 && cache.dtype.is_quantized() {
            // The rows rotated into the scratch first (nothing the scratch held is read later:
            // only routing calls keep it).
            let values = rows.elements();
            let rotated = self.scratch(values * 4)?;
            self.rotate(pr, rotated, values, rot)?;
            pr = rotated;
        }
        let (ps, pp) = (addr(slots, "slots")?, addr(pos, "positions")?);
        let (w, len, ns) = (cache.ne[0] as i32, cache.ne[1] as i32, cache.ne[2] as i32);
        let err = self.error_word;
        let f = self.func(name)?;
        let mut l = self.args(&f);
        l.arg(&pr)
            .arg(&pc)
            .arg(&ps)
            .arg(&pp)
            .arg(&w)
            .arg(&len)
            .arg(&ns);
        if code > 1 {
            l.arg(&code);
        }
        l.arg(&err);
        if n > 0 {
            // SAFETY: slots and positions are checked on the card; rows inside spans.
            unsafe { l.launch(cfg(n as u32, 128)) }.map_err(driver_err(name))?;
        }
        Ok(())
    }
}
