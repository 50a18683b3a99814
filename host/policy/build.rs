use std::env;
use std::path::PathBuf;

fn main() {
    toolsmith_build::link_libtorch();
    compile_packed_linear();
}

/// Compiles `csrc/packed_linear.cpp` (oneDNN's prepacked linear through libtorch's dispatcher)
/// against the libtorch tch links, with the flags torch-sys compiles its own C++ with.
fn compile_packed_linear() {
    println!("cargo:rerun-if-changed=csrc/packed_linear.cpp");
    for var in ["DEP_TCH_LIBTORCH_LIB", "LIBTORCH_INCLUDE", "LIBTORCH_CXX11_ABI"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let include = match (env::var("LIBTORCH_INCLUDE"), env::var("DEP_TCH_LIBTORCH_LIB")) {
        (Ok(dir), _) => PathBuf::from(dir).join("include"),
        (_, Ok(lib)) => PathBuf::from(lib).join("..").join("include"),
        _ => panic!("neither LIBTORCH_INCLUDE nor DEP_TCH_LIBTORCH_LIB is set: cannot find libtorch's headers"),
    };
    let abi = env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_owned());
    cc::Build::new()
        .cpp(true)
        .file("csrc/packed_linear.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", abi.as_str())
        .define("GLOG_USE_GLOG_EXPORT", None)
        .warnings(false)
        .extra_warnings(false)
        .compile("toolsmith_packed_linear");
}
