//! Compiles `corvid/v1/*.proto` with protox (pure Rust, so no `protoc` is needed)
//! and generates the prost messages and tonic client/server.
//!
//! The client and server are generated from a second view of the same file in which
//! `StepChunk.step` is `bytes` instead of a `Step` message. The two are the same on the
//! wire (both length-delimited), so any client of `learner.proto` talks to Corvid's
//! server and Corvid's client to any server. An actor encodes each step once, for its
//! journal and the stream alike, and the learner receives it as the bytes that arrived: it
//! checks them once and stores them as they are (`corvid_proto::encoded`).

use prost_types::field_descriptor_proto::Type;
use prost_types::{DescriptorProto, OneofDescriptorProto};

/// The messages the encoded view generates itself; every other type is `crate::pb`'s.
const ENCODED: [&str; 2] = ["TrajectoryPart", "StepChunk"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["corvid/v1/learner.proto"];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["."])?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .compile_fds(fds.clone())?;

    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("encoded");
    std::fs::create_dir_all(&out)?;
    let mut encoded = fds;
    let mut builder = tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .out_dir(&out)
        .bytes(".corvid.v1.StepChunk.step");
    for file in &mut encoded.file {
        let package = file.package().to_owned();
        for m in &mut file.message_type {
            let name = m.name().to_owned();
            if !ENCODED.contains(&name.as_str()) {
                builder =
                    builder.extern_path(format!(".{package}.{name}"), format!("crate::pb::{name}"));
                continue;
            }
            if !(m.nested_type.is_empty() && m.enum_type.is_empty()) {
                return Err(format!("learner.proto: {name} gained nested types; give them extern paths to crate::pb").into());
            }
            if name == "StepChunk" {
                step_as_optional_bytes(m)?;
            }
        }
        for e in &file.enum_type {
            let name = e.name();
            builder =
                builder.extern_path(format!(".{package}.{name}"), format!("crate::pb::{name}"));
        }
    }
    builder.compile_fds(encoded)?;
    Ok(())
}

/// `StepChunk.step` as `optional bytes`, so that a chunk without a step reads as `None`, as
/// the message field does.
fn step_as_optional_bytes(m: &mut DescriptorProto) -> Result<(), Box<dyn std::error::Error>> {
    let oneof = m.oneof_decl.len() as i32;
    m.oneof_decl.push(OneofDescriptorProto {
        name: Some("_step".into()),
        options: None,
    });
    let step = m
        .field
        .iter_mut()
        .find(|f| f.name() == "step")
        .ok_or("learner.proto: StepChunk has no field `step`")?;
    step.set_type(Type::Bytes);
    step.type_name = None;
    step.oneof_index = Some(oneof);
    step.proto3_optional = Some(true);
    Ok(())
}
