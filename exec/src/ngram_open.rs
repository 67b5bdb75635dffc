//! Finding a model's hashed n-gram tables in its file and checking them against the spec's
//! n-gram constants, for [`NgramTables`] to gather from (kept apart from it: the executor, which
//! the load's errors name, uses the gatherer).

use std::path::Path;

use bloomery_gguf::GgufModel;
use bloomery_plugin_api::model::{ModelSpec, WeightClass};
use bloomery_plugin_api::ngram::NgramSpec;
use bloomery_tiering::arena::StackSource;
use bloomery_tiering::HostSlice;

use crate::error::ModelError;
use crate::ngram_table::{NgramTables, Table};
use crate::weights::weight_tensor;

/// The n-gram tables `spec` declares (its weights of class `NgramTable`, table `t` the `t`-th),
/// in `file`, read from disk through a cache of `disk_cache` bytes of rows when that is given;
/// None when it declares none. A spec with tables but no n-gram constants, or tables whose count
/// or width disagrees with them, is refused.
pub fn open_tables(
    file: &GgufModel,
    spec: &ModelSpec,
    disk_cache: Option<u64>,
) -> Result<Option<NgramTables>, ModelError> {
    let declared: Vec<&str> = spec
        .weights
        .iter()
        .filter(|w| w.class == WeightClass::NgramTable)
        .map(|w| w.name.as_str())
        .collect();
    if declared.is_empty() {
        return Ok(None);
    }
    let bad = |what: String| ModelError::Request(format!("n-gram tables: {what}"));
    let ngram: &NgramSpec = spec.ngram.as_ref().into_option().ok_or_else(|| {
        bad(format!(
            "{} declared without the row ids' constants (ModelSpec::ngram)",
            declared.join(", ")
        ))
    })?;
    if declared.len() != ngram.tables as usize {
        return Err(bad(format!(
            "{} table weights for {} tables of row ids",
            declared.len(),
            ngram.tables
        )));
    }
    let mut tables = Vec::with_capacity(declared.len());
    for name in &declared {
        let (t, ne, nb) = weight_tensor(file, spec, name)?;
        let data = file.tensor_data(t)?;
        if let Some(first) = tables.first().filter(|f: &&Table| f.width != ne[0]) {
            return Err(bad(format!(
                "`{name}` has rows of {} values, `{}` of {}",
                ne[0], first.name, first.width
            )));
        }
        tables.push(Table {
            name: (*name).to_owned(),
            dtype: t.info.dtype,
            width: ne[0],
            row_bytes: nb[1] as usize,
            rows: ne[1],
            mapped: HostSlice::of(data),
            source: StackSource {
                part: t.part,
                offset: t.info.start,
                stride: nb[1],
            },
        });
    }
    let paths: Vec<&Path> = file.parts().iter().map(|p| p.path()).collect();
    let disk = disk_cache.map(|bytes| (&paths[..], bytes));
    NgramTables::new(tables, ngram.per_table(), disk)
        .map(Some)
        .map_err(ModelError::Request)
}
