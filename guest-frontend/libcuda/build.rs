fn main() {
    // Loaded as libcuda.so.1 by programs linked against the real driver.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
