//! Minimal GGUF (v2/v3) reader: metadata scalars and tensor descriptors, bounds-checked.

use std::collections::BTreeMap;
use std::path::Path;

use thiserror::Error;

/// A GGUF parsing failure.
#[derive(Debug, Error)]
pub enum GgufError {
    /// Reading the file failed.
    #[error("cannot read the model file {path}")]
    Read {
        /// Path.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Not a GGUF file or a version we do not read.
    #[error("not a GGUF v2/v3 file")]
    Format,
    /// The file ended early or a field is out of range.
    #[error("GGUF file is corrupt at {0}")]
    Corrupt(&'static str),
    /// A metadata key the model needs is missing.
    #[error("GGUF metadata key {0} is missing")]
    Missing(String),
}

/// A metadata value (arrays are skipped and recorded by length only).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Any integer.
    Int(i64),
    /// Any float.
    Float(f64),
    /// Boolean.
    Bool(bool),
    /// String.
    Str(String),
    /// Array (element count only).
    Array(u64),
}

/// One tensor's descriptor.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// Name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions, fastest first (ggml order).
    pub dims: Vec<u64>,
    /// ggml type id.
    pub ty: u32,
    /// Absolute offset of the data in the file.
    pub offset: usize,
}

impl TensorInfo {
    /// Number of elements.
    pub fn elements(&self) -> usize {
        self.dims.iter().product::<u64>() as usize
    }
}

/// A parsed GGUF file held in memory.
pub struct Gguf {
    /// The whole file.
    pub data: Vec<u8>,
    /// Metadata.
    pub meta: BTreeMap<String, Value>,
    /// Tensors in file order.
    pub tensors: Vec<TensorInfo>,
}

struct Rd<'a> {
    b: &'a [u8],
    at: usize,
}

impl Rd<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], GgufError> {
        let end = self.at.checked_add(n).ok_or(GgufError::Corrupt("length"))?;
        let s = self.b.get(self.at..end).ok_or(GgufError::Corrupt("eof"))?;
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, GgufError> {
        let s = self.take(4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self) -> Result<u64, GgufError> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
    fn string(&mut self) -> Result<String, GgufError> {
        let n = self.u64()? as usize;
        let s = self.take(n)?;
        Ok(String::from_utf8_lossy(s).into_owned())
    }
    fn value(&mut self, ty: u32) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::Int(i64::from(self.take(1)?[0])),
            1 => Value::Int(i64::from(self.take(1)?[0] as i8)),
            2 => {
                let s = self.take(2)?;
                Value::Int(i64::from(u16::from_le_bytes([s[0], s[1]])))
            }
            3 => {
                let s = self.take(2)?;
                Value::Int(i64::from(i16::from_le_bytes([s[0], s[1]])))
            }
            4 => Value::Int(i64::from(self.u32()?)),
            5 => Value::Int(i64::from(self.u32()? as i32)),
            6 => Value::Float(f64::from(f32::from_bits(self.u32()?))),
            7 => Value::Bool(self.take(1)?[0] != 0),
            8 => Value::Str(self.string()?),
            9 => {
                let ety = self.u32()?;
                let n = self.u64()?;
                for _ in 0..n {
                    self.value(ety)?;
                }
                Value::Array(n)
            }
            10 => Value::Int(self.u64()? as i64),
            11 => Value::Int(self.u64()? as i64),
            12 => Value::Float(f64::from_bits(self.u64()?)),
            _ => return Err(GgufError::Corrupt("value type")),
        })
    }
}

impl Gguf {
    /// Reads and parses a GGUF file.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let data = std::fs::read(path).map_err(|source| GgufError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(data)
    }

    /// Parses GGUF bytes.
    pub fn parse(data: Vec<u8>) -> Result<Self, GgufError> {
        let mut r = Rd { b: &data, at: 0 };
        if r.take(4)? != b"GGUF" {
            return Err(GgufError::Format);
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::Format);
        }
        let n_tensors = r.u64()? as usize;
        let n_kv = r.u64()? as usize;
        if n_tensors > 1 << 20 || n_kv > 1 << 20 {
            return Err(GgufError::Corrupt("counts"));
        }
        let mut meta = BTreeMap::new();
        for _ in 0..n_kv {
            let k = r.string()?;
            let ty = r.u32()?;
            let v = r.value(ty)?;
            meta.insert(k, v);
        }
        let mut tensors = Vec::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            let name = r.string()?;
            let nd = r.u32()? as usize;
            if nd > 4 {
                return Err(GgufError::Corrupt("tensor rank"));
            }
            let dims = (0..nd).map(|_| r.u64()).collect::<Result<Vec<_>, _>>()?;
            let ty = r.u32()?;
            let offset = r.u64()? as usize;
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                offset,
            });
        }
        let align = match meta.get("general.alignment") {
            Some(Value::Int(a)) if *a > 0 => *a as usize,
            _ => 32,
        };
        let base = r.at.div_ceil(align) * align;
        for t in &mut tensors {
            t.offset = base
                .checked_add(t.offset)
                .ok_or(GgufError::Corrupt("offset"))?;
            let bytes = super::dequant::byte_size(t.ty, t.elements())
                .ok_or(GgufError::Corrupt("tensor type"))?;
            if t.offset.checked_add(bytes).is_none_or(|e| e > data.len()) {
                return Err(GgufError::Corrupt("tensor extent"));
            }
        }
        Ok(Self {
            data,
            meta,
            tensors,
        })
    }

    /// An integer metadata value.
    pub fn int(&self, key: &str) -> Result<i64, GgufError> {
        match self.meta.get(key) {
            Some(Value::Int(v)) => Ok(*v),
            _ => Err(GgufError::Missing(key.into())),
        }
    }

    /// A float metadata value.
    pub fn float(&self, key: &str) -> Result<f64, GgufError> {
        match self.meta.get(key) {
            Some(Value::Float(v)) => Ok(*v),
            Some(Value::Int(v)) => Ok(*v as f64),
            _ => Err(GgufError::Missing(key.into())),
        }
    }

    /// A tensor by name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of a tensor.
    pub fn tensor_bytes(&self, t: &TensorInfo) -> &[u8] {
        let n = super::dequant::byte_size(t.ty, t.elements()).unwrap_or(0);
        &self.data[t.offset..t.offset + n]
    }
}
