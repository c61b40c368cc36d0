//! The worker's view of the broker's weights: map a published region read-only, or cold load
//! (parse GGUF, dequantize into a fresh broker region, publish).

use std::path::Path;
use std::time::Instant;

use super::WorkerError;
use crate::client::{Client, RegionFd};
use crate::mapping::Mapping;
use crate::model::gguf::Gguf;
use crate::model::layout::{Layout, dequantize_into};
use crate::wire::RegionKind;

/// Published weights mapped read-only.
pub struct MappedWeights {
    /// Layout from the region metadata.
    pub layout: Layout,
    /// Checksum recorded by the broker.
    pub checksum: u64,
    map: Mapping,
}

impl MappedWeights {
    /// Maps a published weights region read-only.
    pub fn map(r: &RegionFd) -> Result<Self, WorkerError> {
        let layout = Layout::from_meta(&r.info.meta).map_err(WorkerError::Layout)?;
        if layout.bytes().is_none_or(|b| b as u64 > r.info.bytes) {
            return Err(WorkerError::Protocol(
                "weights region smaller than its layout".into(),
            ));
        }
        let map = Mapping::new(&r.fd, r.info.bytes as usize, false)
            .map_err(|e| WorkerError::Map("weights", e))?;
        Ok(Self {
            layout,
            checksum: r.info.checksum,
            map,
        })
    }

    /// The weights as f32 (read in place from the broker's memory).
    pub fn floats(&self) -> &[f32] {
        // SAFETY: the mapping is page-aligned (so f32-aligned), at least layout.total floats long
        // (checked in `map`), read-only, and lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<f32>(), self.layout.total) }
    }
}

/// Finds the published weights in a manifest.
pub fn published(regions: &[RegionFd]) -> Option<&RegionFd> {
    regions
        .iter()
        .find(|r| r.info.kind == RegionKind::Weights && r.info.published)
}

/// Cold path: read the GGUF (unless already `opened`), dequantize into a new broker region, publish, map read-only.
/// Returns the weights and the seconds spent.
pub fn cold_load(
    client: &Client,
    model: &Path,
    opened: Option<Gguf>,
    threads: usize,
) -> Result<(MappedWeights, f64), WorkerError> {
    let t = Instant::now();
    let g = match opened {
        Some(g) => g,
        None if !model.is_file() => {
            return Err(WorkerError::ModelMissing(model.display().to_string()));
        }
        None => Gguf::open(model).map_err(WorkerError::Gguf)?,
    };
    let layout = Layout::from_gguf(&g).map_err(WorkerError::Gguf)?;
    let bytes = layout
        .bytes()
        .ok_or_else(|| WorkerError::Protocol("weights layout size overflows".into()))?;
    let region = client
        .alloc_weights(layout.version, bytes as u64)
        .map_err(WorkerError::Client)?;
    if region.info.bytes < bytes as u64 {
        return Err(WorkerError::Protocol(
            "weights region smaller than its layout".into(),
        ));
    }
    let checksum = {
        let mut m = Mapping::new(&region.fd, region.info.bytes as usize, true)
            .map_err(|e| WorkerError::Map("weights (writable)", e))?;
        let bytes = m.bytes_mut();
        // SAFETY: the mapping is page-aligned and writable; we view its first layout.total f32s,
        // which fit (the region holds at least layout.bytes(), checked above).
        let floats = unsafe {
            std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<f32>(), layout.total)
        };
        if !dequantize_into(&g, &layout, floats, threads) {
            return Err(WorkerError::Protocol("dequantization failed".into()));
        }
        crate::checksum::checksum(m.bytes())
        // The writable mapping is dropped here: the broker can then seal the region.
    };
    drop(g);
    client
        .publish(layout.version, checksum, layout.to_meta())
        .map_err(WorkerError::Client)?;
    let map = Mapping::new(&region.fd, region.info.bytes as usize, false)
        .map_err(|e| WorkerError::Map("weights", e))?;
    Ok((
        MappedWeights {
            layout,
            checksum,
            map,
        },
        t.elapsed().as_secs_f64(),
    ))
}

/// Test hook: write garbage into the weights through a writable mapping (fails on a sealed
/// region, as it should).
pub fn scribble(regions: &[RegionFd]) -> Result<(), WorkerError> {
    let r = published(regions).ok_or_else(|| WorkerError::Protocol("no weights".into()))?;
    let mut m = Mapping::new(&r.fd, r.info.bytes as usize, true)
        .map_err(|e| WorkerError::Map("weights (scribble)", e))?;
    let b = m.bytes_mut();
    let n = b.len();
    for i in (0..n).step_by(4096).take(64) {
        b[i] ^= 0x5a;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Region;
    use crate::backend::host::HostRegion;
    use crate::model::layout::LlamaConfig;
    use crate::wire::RegionInfo;

    #[test]
    fn a_layout_larger_than_any_region_is_refused() {
        let r = HostRegion::create("t", 4096).unwrap();
        let layout = Layout {
            config: LlamaConfig::unit(),
            slots: Vec::new(),
            // Four bytes each: the byte size wraps to a few bytes without a checked product.
            total: usize::MAX / 4 + 2,
            version: 1,
        };
        let fd = RegionFd {
            info: RegionInfo {
                kind: RegionKind::Weights,
                bytes: 4096,
                version: 1,
                checksum: 0,
                published: true,
                page_bytes: 0,
                meta: layout.to_meta(),
            },
            fd: r.handle().try_clone_to_owned().unwrap(),
        };
        assert!(matches!(
            MappedWeights::map(&fd),
            Err(WorkerError::Protocol(_))
        ));
    }
}
