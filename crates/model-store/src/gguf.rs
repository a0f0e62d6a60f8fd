//! Reading GGUF files: the header, every metadata pair, and the tensor descriptions, streamed
//! from a buffered reader; tensor data is never read, so a multi-gigabyte file opens in
//! milliseconds. Every count and length is checked against the bytes left in the file before
//! anything is allocated, so damage gives a [`GgufError`] naming the place, never a panic.

mod error;
mod ftype;
mod header;
mod stream;
mod tensor;
mod value;

pub use error::{GgufError, GgufErrorKind, Item, TensorProblem};
pub use ftype::quantization_name;
pub use header::{GgufHeader, PoolingType};
pub use value::{GgufArray, GgufType, GgufValue, INLINE_ARRAY_MAX};
