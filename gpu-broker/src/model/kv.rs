//! Paged KV cache inside the broker's arena: a page holds `BLOCK` token slots of every layer's
//! keys and values; each request owns a block table of page indices.

/// Token slots per page.
pub const BLOCK: usize = 16;

/// Geometry of one page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGeom {
    /// Layers.
    pub layers: usize,
    /// Key/value width.
    pub kv_dim: usize,
}

impl KvGeom {
    /// f32 elements per page.
    pub fn page_floats(&self) -> usize {
        self.layers * 2 * BLOCK * self.kv_dim
    }

    /// Bytes per page.
    pub fn page_bytes(&self) -> usize {
        self.page_floats() * 4
    }

    /// Element offset of (page, layer, K or V, slot).
    #[inline]
    pub fn offset(&self, page: u32, layer: usize, v: bool, slot: usize) -> usize {
        page as usize * self.page_floats()
            + ((layer * 2 + usize::from(v)) * BLOCK + slot) * self.kv_dim
    }
}

/// A view of KV pages (the mapped arena, or a local buffer for warm-up).
pub struct KvArena<'a> {
    /// All pages' floats.
    pub data: &'a mut [f32],
    /// Page geometry.
    pub geom: KvGeom,
}

impl KvArena<'_> {
    /// Pages in the view.
    pub fn pages(&self) -> usize {
        self.data.len() / self.geom.page_floats()
    }
}

/// Pages needed for `tokens` positions.
pub fn pages_for(tokens: usize) -> usize {
    tokens.div_ceil(BLOCK)
}
