fn main() {
    toolsmith_build::link_libtorch();
}
