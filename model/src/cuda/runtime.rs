//! Finding the CUDA driver and NVRTC at run time, compiling the kernel sources, and one loaded
//! module per device and source.
//!
//! `cudarc` loads `libcuda` and `libnvrtc` with `dlopen` on first use and panics when it
//! cannot; everything here asks `is_culib_present` first and returns
//! [`CudaError::Unavailable`] instead. When `libnvrtc` is not on the library path, it is
//! loaded by full path from the PyTorch wheel this process links (libtorch's folder is read
//! from `/proc/self/maps`: `<site-packages>/torch/lib` → `<site-packages>/nvidia/cu13/lib`),
//! from `$CORVID_NVRTC`, `$CUDA_HOME/lib64` or `/usr/local/cuda/lib64`. Once a library with the
//! soname `libnvrtc.so.13` is loaded, `cudarc`'s own `dlopen` by name finds it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions, Ptx};
use tch::Device;

use super::CudaError;

const COMMON_SRC: &str = include_str!("common.cuh");
const MLA_SRC: &str = include_str!("mla_decode.cu");
const MOE_SRC: &str = include_str!("moe_dispatch.cu");

/// The MLA decode source specialised to latent rank `c` and RoPE width `r` (compile-time
/// constants, so per-thread accumulator arrays stay in registers).
pub fn mla_source(c: i64, r: i64) -> String {
    format!("#define C_DIM {c}\n#define R_DIM {r}\n{COMMON_SRC}\n{MLA_SRC}")
}

/// The MoE dispatch/combine source.
pub fn moe_source() -> String {
    format!("{COMMON_SRC}\n{MOE_SRC}")
}

/// Paths where `libnvrtc.so.13` may be, most specific first.
fn nvrtc_candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("CORVID_NVRTC") {
        out.push(PathBuf::from(p));
    }
    let mut torch_lib_dirs = Vec::new();
    if let Ok(maps) = std::fs::read_to_string("/proc/self/maps") {
        for line in maps.lines() {
            let Some(path) = line.split_whitespace().nth(5) else {
                continue;
            };
            if path.ends_with("/libtorch_cpu.so") || path.ends_with("/libc10.so") {
                if let Some(dir) = Path::new(path).parent() {
                    if !torch_lib_dirs.iter().any(|d: &PathBuf| d == dir) {
                        torch_lib_dirs.push(dir.to_path_buf());
                    }
                }
            }
        }
    }
    if let Some(libtorch) = std::env::var_os("LIBTORCH") {
        torch_lib_dirs.push(PathBuf::from(libtorch).join("lib"));
    }
    for dir in torch_lib_dirs {
        // <site-packages>/torch/lib → <site-packages>/nvidia/cu13/lib
        if let Some(site) = dir.parent().and_then(Path::parent) {
            out.push(site.join("nvidia/cu13/lib/libnvrtc.so.13"));
        }
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = std::env::var_os(var) {
            out.push(PathBuf::from(&root).join("lib64/libnvrtc.so.13"));
            out.push(PathBuf::from(&root).join("lib64/libnvrtc.so"));
        }
    }
    out.push(PathBuf::from("/usr/local/cuda/lib64/libnvrtc.so.13"));
    out.push(PathBuf::from("/usr/local/cuda/lib64/libnvrtc.so"));
    out
}

/// Where NVRTC came from (`None`: not found), decided once per process.
fn nvrtc_origin() -> &'static Option<String> {
    static ORIGIN: OnceLock<Option<String>> = OnceLock::new();
    ORIGIN.get_or_init(|| {
        // SAFETY: dlopen of a library by name; nothing is called.
        if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Some("library search path".into());
        }
        for path in nvrtc_candidates() {
            if !path.is_file() {
                continue;
            }
            // NVRTC dlopens its builtins by name at the first compile; a copy loaded by path
            // from the same folder satisfies that when the folder is not on the search path.
            if let Some(dir) = path.parent() {
                preload_builtins(dir);
            }
            // SAFETY: loading NVRTC runs no initialisers with preconditions; the handle is
            // leaked on purpose so the library stays loaded for cudarc's dlopen by soname.
            if let Ok(lib) = unsafe { libloading::Library::new(&path) } {
                std::mem::forget(lib);
                // SAFETY: as above.
                if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
                    return Some(path.display().to_string());
                }
            }
        }
        None
    })
}

/// Loads `libnvrtc-builtins.so*` from `dir` (kept loaded), if there is one.
fn preload_builtins(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("libnvrtc-builtins.so") && !name.contains(".alt.") {
            // SAFETY: as for NVRTC below: a plain shared library, leaked to stay loaded.
            if let Ok(lib) = unsafe { libloading::Library::new(entry.path()) } {
                std::mem::forget(lib);
            }
        }
    }
}

/// Ok when NVRTC can be loaded in this process; the error says where it was looked for.
pub fn nvrtc_loadable() -> Result<String, CudaError> {
    nvrtc_origin().clone().ok_or_else(|| {
        let looked: Vec<String> = nvrtc_candidates()
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        CudaError::Unavailable(format!(
            "libnvrtc.so.13 not found on the library path nor at {}",
            looked.join(", ")
        ))
    })
}

/// Ok when the CUDA driver library can be loaded.
pub fn driver_loadable() -> Result<(), CudaError> {
    // SAFETY: dlopen of a library by name; nothing is called.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::Unavailable(
            "the CUDA driver library (libcuda.so.1) cannot be loaded".into(),
        ))
    }
}

/// Total memory of CUDA device `ordinal` in bytes (`cuDeviceTotalMem`, no context created);
/// `None` when the driver library cannot be loaded or does not answer.
pub fn device_total_memory(ordinal: usize) -> Option<u64> {
    driver_loadable().ok()?;
    cudarc::driver::result::init().ok()?;
    let dev = cudarc::driver::result::device::get(i32::try_from(ordinal).ok()?).ok()?;
    // SAFETY: `dev` was returned by `cuDeviceGet` just above.
    let bytes = unsafe { cudarc::driver::result::device::total_mem(dev) }.ok()?;
    u64::try_from(bytes).ok()
}

/// Bytes in use on CUDA device `ordinal` (`cuMemGetInfo`: total − free, every process's
/// allocations included), read in the device's primary context, which this call makes
/// current on the calling thread (as `cudaSetDevice` does; libtorch sets its device again
/// before its next kernel). `None` when the driver cannot be loaded or does not answer.
pub fn device_used_memory(ordinal: usize) -> Option<u64> {
    driver_loadable().ok()?;
    cudarc::driver::result::init().ok()?;
    let dev = cudarc::driver::result::device::get(i32::try_from(ordinal).ok()?).ok()?;
    // SAFETY: `dev` was returned by `cuDeviceGet`; the primary context it names is the one
    // libtorch's runtime uses, retained here (the driver counts retains) and made current.
    unsafe {
        let ctx = cudarc::driver::result::primary_ctx::retain(dev).ok()?;
        cudarc::driver::result::ctx::set_current(ctx).ok()?;
    }
    let (free, total) = cudarc::driver::result::mem_get_info().ok()?;
    u64::try_from(total.checked_sub(free)?).ok()
}

/// Ok when the custom kernels can run on `device`: a CUDA device libtorch sees, the driver
/// library and NVRTC.
pub fn availability(device: Device) -> Result<(), CudaError> {
    let Device::Cuda(index) = device else {
        return Err(CudaError::Unavailable(format!(
            "{device:?} is not a CUDA device"
        )));
    };
    if !tch::Cuda::is_available() {
        return Err(CudaError::Unavailable(
            "libtorch sees no CUDA device (tch::Cuda::is_available() is false: no GPU or \
             driver, or a CPU-only libtorch)"
                .into(),
        ));
    }
    let count = tch::Cuda::device_count();
    if index as i64 >= count {
        return Err(CudaError::Unavailable(format!(
            "cuda:{index} does not exist ({count} device(s))"
        )));
    }
    driver_loadable()?;
    nvrtc_loadable()?;
    Ok(())
}

/// `sm_XY` for compute capability X.Y (a static string, as NVRTC options want).
fn arch_name(major: i32, minor: i32) -> &'static str {
    match (major, minor) {
        (7, 5) => "sm_75",
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 7) => "sm_87",
        (8, 9) => "sm_89",
        (9, 0) => "sm_90",
        (10, 0) => "sm_100",
        (12, 0) => "sm_120",
        _ => Box::leak(format!("sm_{major}{minor}").into_boxed_str()),
    }
}

/// Compiles `src` for `arch` (e.g. `sm_90`) to PTX; `what` names it in errors.
pub fn compile(src: &str, what: &str, arch: &'static str) -> Result<Ptx, CudaError> {
    nvrtc_loadable()?;
    let opts = CompileOptions {
        arch: Some(arch),
        name: Some(format!("{what}.cu")),
        ..Default::default()
    };
    compile_ptx_with_opts(src, opts).map_err(|e| CudaError::Compile {
        kernel: what.to_string(),
        log: match e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        },
    })
}

/// Compiles every kernel source for `arch` (MLA decode for each `(c, r)` of `mla_shapes`)
/// without a GPU; returns `(source name, PTX bytes)`. Needs only NVRTC.
pub fn compile_all(
    arch: &'static str,
    mla_shapes: &[(i64, i64)],
) -> Result<Vec<(String, usize)>, CudaError> {
    let mut out = Vec::new();
    for &(c, r) in mla_shapes {
        let name = format!("mla_decode_c{c}_r{r}");
        let ptx = compile(&mla_source(c, r), &name, arch)?;
        out.push((name, ptx.to_src().len()));
    }
    let ptx = compile(&moe_source(), "moe_dispatch", arch)?;
    out.push(("moe_dispatch".into(), ptx.to_src().len()));
    Ok(out)
}

/// The name the driver reports for CUDA device `ordinal` (`NVIDIA H200`).
pub fn device_name(ordinal: usize) -> Result<String, CudaError> {
    Ok(device_runtime(ordinal)?.name())
}

/// One device's context (the primary one, shared with libtorch) and its loaded kernels.
pub(crate) struct DeviceRuntime {
    ctx: Arc<CudaContext>,
    arch: &'static str,
    /// Streaming multiprocessors.
    pub(crate) sm_count: i64,
    /// The most dynamic shared memory a block may opt in to, in bytes.
    pub(crate) smem_optin: i64,
    /// Compute capability major version.
    pub(crate) cc_major: i32,
    modules: Mutex<HashMap<String, Arc<CudaModule>>>,
}

impl DeviceRuntime {
    /// The device's name as the driver reports it.
    pub(crate) fn name(&self) -> String {
        self.ctx
            .name()
            .unwrap_or_else(|e| format!("unknown device ({e})"))
    }

    /// The null stream: libtorch's current stream unless something set another.
    pub(crate) fn stream(&self) -> Arc<CudaStream> {
        self.ctx.default_stream()
    }

    /// Function `name` of the module `key`, compiling `src()` on first use.
    pub(crate) fn function(
        &self,
        key: &str,
        src: impl FnOnce() -> String,
        name: &str,
    ) -> Result<CudaFunction, CudaError> {
        let module = {
            let mut modules = self
                .modules
                .lock()
                .map_err(|_| CudaError::Driver("kernel cache lock poisoned".into()))?;
            match modules.get(key) {
                Some(m) => m.clone(),
                None => {
                    let ptx = compile(&src(), key, self.arch)?;
                    let m = self.ctx.load_module(ptx)?;
                    modules.insert(key.to_string(), m.clone());
                    m
                }
            }
        };
        Ok(module.load_function(name)?)
    }

    /// Lets `func` use `bytes` of dynamic shared memory (needed above 48 KiB).
    pub(crate) fn allow_smem(&self, func: &CudaFunction, bytes: i64) -> Result<(), CudaError> {
        if bytes > 48 * 1024 {
            func.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )?;
        }
        Ok(())
    }
}

/// The runtime of CUDA device `ordinal`, created on first use (after [`availability`]).
pub(crate) fn device_runtime(ordinal: usize) -> Result<Arc<DeviceRuntime>, CudaError> {
    static RUNTIMES: OnceLock<Mutex<HashMap<usize, Arc<DeviceRuntime>>>> = OnceLock::new();
    availability(Device::Cuda(ordinal))?;
    let map = RUNTIMES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map
        .lock()
        .map_err(|_| CudaError::Driver("runtime lock poisoned".into()))?;
    if let Some(rt) = map.get(&ordinal) {
        return Ok(rt.clone());
    }
    let ctx = CudaContext::new(ordinal)?;
    let (major, minor) = ctx.compute_capability()?;
    let sm_count = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let smem_optin =
        ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
    let rt = Arc::new(DeviceRuntime {
        ctx,
        arch: arch_name(major, minor),
        sm_count: sm_count as i64,
        smem_optin: smem_optin as i64,
        cc_major: major,
        modules: Mutex::new(HashMap::new()),
    });
    map.insert(ordinal, rt.clone());
    Ok(rt)
}

/// The CUDA ordinal of `device`, or an input error naming `what` when it is not CUDA.
pub(crate) fn cuda_ordinal(device: Device, what: &str) -> Result<usize, CudaError> {
    match device {
        Device::Cuda(i) => Ok(i),
        other => Err(CudaError::Input(format!(
            "{what} is on {other:?}; the custom kernels need CUDA tensors"
        ))),
    }
}
