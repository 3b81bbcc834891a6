//! Training infrastructure shared by the experiments: device selection, the training step,
//! provenance and atomic result files.

pub mod device;
pub mod provenance;
pub mod step;

pub use device::Backend;
pub use provenance::{Provenance, write_atomic, write_json};
