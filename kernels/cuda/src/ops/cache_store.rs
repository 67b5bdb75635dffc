//! The K/V cache store (`cu/cache_store.cuh`): each row written at row `position % len` of its
//! slot in an f32 or f16 cache, a block per row, slots and positions checked on the card. The
//! stores that follow a per-head RMSNorm and Rope go in their launch (`fused::norm_rope`).

use bloomery_plugin_api::op::{OpKind, OpSupport};
use bloomery_plugin_api::tensor::OpCall;
use bloomery_plugin_api::{DType, PluginError};

use super::{cfg, claim, driver_err, f32_only, Addr, Launcher, Src};

/// The `(op, dtypes)` pairs this family implements.
pub(super) fn claims() -> Vec<OpSupport> {
    vec![claim(OpKind::CacheStore, &[DType::F32, DType::F16])]
}

impl Launcher {
    /// Rows (source 0) into the cache (source 1, the call's destination) at their slots and
    /// positions (sources 2 and 3).
    pub(super) fn cache_store<'c>(
        &self,
        addr: Addr<'_>,
        src: Src<'_, 'c>,
        c: &'c OpCall,
    ) -> Result<(), PluginError> {
        let (rows, cache, slots, pos) = (src(0)?, src(1)?, src(2)?, src(3)?);
        if *cache != c.dst {
            return Err(PluginError::invalid(
                "CacheStore must write the cache it names",
            ));
        }
        f32_only(rows, "CacheStore rows")?;
        let name = match cache.dtype {
            DType::F32 => "bl_cache_store_f32",
            DType::F16 => "bl_cache_store_f16",
            t => {
                return Err(PluginError::unsupported(
                    format!("CacheStore into {t}"),
                    &[],
                ))
            }
        };
        let n = rows.rows();
        if rows.ne[0] != cache.ne[0] || slots.elements() != n || pos.elements() != n {
            return Err(PluginError::invalid("CacheStore shapes"));
        }
        let (pr, pc) = (addr(rows, "rows")?, addr(cache, "cache")?);
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
            .arg(&ns)
            .arg(&err);
        if n > 0 {
            // SAFETY: slots and positions are checked on the card; rows inside spans.
            unsafe { l.launch(cfg(n as u32, 128)) }.map_err(driver_err(name))?;
        }
        Ok(())
    }
}
