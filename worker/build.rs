// The same build information as demux's (`QUICDEMUX_GIT_COMMIT` for `--version`).
include!("../demux/build.rs");
