//! Training infrastructure shared by the experiments: device selection, the training step,
//! provenance and atomic result files.

pub mod device;
pub mod lm_qa_task;
pub mod lm_task;
pub mod optimizer;
pub mod provenance;
pub mod schedule;
pub mod step;
pub mod t5_task;
pub mod trainer;

pub use device::Backend;
pub use provenance::{Provenance, write_atomic, write_json};
