#![doc = include_str!("../README.md")]

pub mod batch;
pub mod error;
mod filter;
pub mod fixed_point;
mod fused;
pub mod logits;
pub mod params;
pub mod reference;
pub mod rng;
pub mod sampler;
#[cfg(feature = "testing")]
pub mod testing;
pub mod verify;

pub use batch::{sample_batch, verify_batch};
pub use error::SampleError;
pub use logits::{LogitValue, mask_words};
pub use params::{LogprobSource, MIN_TEMPERATURE, SamplingParams};
pub use rng::{DrawKind, PhiloxStream, philox4x32_10};
pub use sampler::{SampleOutput, SampleRequest, Sampler, Scratch, sample};
pub use verify::{Verifier, VerifyMode, VerifyOutput, VerifyRequest, verify};

/// The crate's version, as packaged.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
