//! The one place that turns `--device NAME` into a burn [`Device`]: no backend code in binaries.

use std::fmt;
use std::str::FromStr;

use anyhow::{Result, bail};
use burn::prelude::*;

/// A compute backend chosen at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backend {
    /// burn's pure-Rust CPU backend (always built; the default).
    #[default]
    Flex,
    /// GPU through wgpu (cargo feature `wgpu`).
    Wgpu,
    /// LibTorch's CUDA GPU 0 (cargo feature `tch`; needs a CUDA libtorch 2.9.0, see the README's
    /// Backends). Not libtorch's CPU device: on a CPU, `flex` is the backend (and the faster one).
    Tch,
    /// CUDA through CubeCL (cargo feature `cuda`; its build downloads LLVM).
    Cuda,
}

impl Backend {
    /// Every backend, compiled in or not.
    pub const ALL: [Backend; 4] = [Backend::Flex, Backend::Wgpu, Backend::Tch, Backend::Cuda];

    /// The name `--device` takes.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Flex => "flex",
            Backend::Wgpu => "wgpu",
            Backend::Tch => "tch",
            Backend::Cuda => "cuda",
        }
    }

    /// The plain (inference) device, or an error that names the cargo feature to enable.
    pub fn device(self) -> Result<Device> {
        match self {
            Backend::Flex => Ok(Device::flex()),
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => Ok(Device::wgpu(burn::tensor::DeviceKind::default())),
            // GPU 0, the device `--devices N` starts from too: `Device::libtorch()` is the CPU.
            #[cfg(feature = "tch")]
            #[allow(deprecated)]
            Backend::Tch => Ok(Device::libtorch_cuda(0)),
            #[cfg(feature = "cuda")]
            Backend::Cuda => Ok(Device::cuda(0)),
            #[allow(unreachable_patterns)]
            other => bail!(
                "device `{other}` is not compiled in: rebuild with `--features {other}` (see README, Backends)"
            ),
        }
    }

    /// The device with automatic differentiation, for training.
    pub fn train_device(self) -> Result<Device> {
        Ok(self.device()?.autodiff())
    }

    /// `n` devices with automatic differentiation for data-parallel training (the first is the
    /// main one, see `trainer::train`): GPUs 0..n of the backend. `flex` is one device (it already
    /// uses every core), so more than one is refused.
    pub fn train_devices(self, n: usize) -> Result<Vec<Device>> {
        match n {
            0 => bail!("--devices must be at least 1"),
            1 => return Ok(vec![self.train_device()?]),
            _ => {}
        }
        (0..n).map(|i| self.gpu(i).map(Device::autodiff)).collect()
    }

    /// GPU `index` of this backend, a data-parallel replica's device.
    fn gpu(self, index: usize) -> Result<Device> {
        match self {
            Backend::Flex => bail!(
                "--devices: `flex` is one device (it already uses every CPU core); data-parallel training needs --device wgpu, tch or cuda"
            ),
            #[cfg(feature = "wgpu")]
            Backend::Wgpu => Ok(Device::wgpu(burn::tensor::DeviceKind::DiscreteGpu(index))),
            #[cfg(feature = "tch")]
            #[allow(deprecated)]
            Backend::Tch => Ok(Device::libtorch_cuda(index)),
            #[cfg(feature = "cuda")]
            Backend::Cuda => Ok(Device::cuda(index)),
            #[allow(unreachable_patterns)]
            other => bail!(
                "device `{other}` is not compiled in: rebuild with `--features {other}` (GPU {index})"
            ),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Backend::ALL.iter().map(|b| b.name()).collect();
                anyhow::anyhow!("unknown device `{s}`: choose one of {}", names.join(", "))
            })
    }
}

/// A description of the machine for provenance: backend, CPU model and core count.
pub fn describe(backend: Backend) -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    format!("{backend} ({cpu}, {cores} cores)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_and_rejects_unknown() {
        assert_eq!("flex".parse::<Backend>().unwrap(), Backend::Flex);
        let err = "tpu".parse::<Backend>().unwrap_err().to_string();
        assert!(
            err.contains("unknown device `tpu`") && err.contains("flex"),
            "{err}"
        );
    }

    #[test]
    fn flex_is_one_device() {
        assert_eq!(Backend::Flex.train_devices(1).unwrap().len(), 1);
        let err = Backend::Flex.train_devices(2).unwrap_err().to_string();
        assert!(err.contains("`flex` is one device"), "{err}");
        assert!(Backend::Flex.train_devices(0).is_err());
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn missing_backend_names_the_feature() {
        let err = Backend::Cuda.device().unwrap_err().to_string();
        assert!(err.contains("--features cuda"), "{err}");
    }
}
