//! Tells the code whether the vendored libjpeg-turbo was built with its SIMD extensions.
//!
//! libjpeg-turbo's CMake build enables SIMD only when it finds nasm (or yasm); without them it
//! still builds, and is then slower than zune-jpeg on whole images. turbojpeg-sys installs the
//! library's `jconfig.h`, which records `WITH_SIMD`; the decoder reads `cfg(turbojpeg_simd)` to
//! fall back to zune-jpeg in a build without SIMD (and says so, see `decode::turbo`).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(turbojpeg_simd)");
    println!("cargo::rerun-if-env-changed=DEP_TURBOJPEG_INCLUDE");
    if std::env::var_os("CARGO_FEATURE_TURBOJPEG").is_none() {
        return;
    }
    let Some(include) = std::env::var_os("DEP_TURBOJPEG_INCLUDE") else {
        println!("cargo::warning=turbojpeg-sys reported no include directory; assuming libjpeg-turbo has no SIMD");
        return;
    };
    // Several include directories are separated by commas (turbojpeg-sys' convention).
    let with_simd = include
        .to_string_lossy()
        .split(',')
        .filter_map(|dir| std::fs::read_to_string(std::path::Path::new(dir).join("jconfig.h")).ok())
        .any(|config| config.lines().any(|l| l.trim() == "#define WITH_SIMD 1"));
    if with_simd {
        println!("cargo::rustc-cfg=turbojpeg_simd");
    } else {
        println!(
            "cargo::warning=libjpeg-turbo was built without SIMD (install nasm and rebuild); \
             stoker decodes JPEGs with zune-jpeg instead"
        );
    }
}
