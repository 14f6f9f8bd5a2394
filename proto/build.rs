//! Compiles `corvid/v1/*.proto` with protox (pure Rust, so no `protoc` is needed)
//! and generates the prost messages and tonic client/server.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["corvid/v1/learner.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
