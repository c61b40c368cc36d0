#!/usr/bin/env python3
"""Write a single-layer OCI image archive (for `ctr image import`) from a rootfs directory.

usage: mkimage.py ROOTFS NAME OUT.tar [--cmd ARG ...]

There is no registry on Belayer's machines, so images are made here: the layer is an uncompressed
tar of ROOTFS (numeric owners, xattrs kept), and index.json carries io.containerd.image.name so that
`ctr image import` names the image NAME.
"""
import hashlib, json, os, subprocess, sys, tarfile, tempfile

def blob(d, data):
    digest = hashlib.sha256(data).hexdigest()
    os.makedirs(os.path.join(d, "blobs", "sha256"), exist_ok=True)
    with open(os.path.join(d, "blobs", "sha256", digest), "wb") as f:
        f.write(data)
    return "sha256:" + digest, len(data)

def main():
    rootfs, name, out = sys.argv[1:4]
    cmd = sys.argv[5:] if len(sys.argv) > 4 and sys.argv[4] == "--cmd" else ["/bin/sh"]
    with tempfile.TemporaryDirectory() as d:
        layer_path = os.path.join(d, "layer.tar")
        subprocess.run(["tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-C", rootfs,
                        "-cf", layer_path, "."], check=True)
        with open(layer_path, "rb") as f:
            layer = f.read()
        os.unlink(layer_path)
        layer_digest, layer_size = blob(d, layer)
        config = {
            "architecture": "amd64", "os": "linux",
            "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                       "Cmd": cmd, "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
            "history": [{"created_by": "belayer scripts/mkimage.py"}],
        }
        config_digest, config_size = blob(d, json.dumps(config, sort_keys=True).encode())
        manifest = {
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": config_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": layer_digest, "size": layer_size}],
        }
        manifest_digest, manifest_size = blob(d, json.dumps(manifest, sort_keys=True).encode())
        index = {
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "digest": manifest_digest, "size": manifest_size,
                           "platform": {"architecture": "amd64", "os": "linux"},
                           "annotations": {"io.containerd.image.name": name,
                                           "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]}}],
        }
        with open(os.path.join(d, "index.json"), "w") as f:
            json.dump(index, f)
        with open(os.path.join(d, "oci-layout"), "w") as f:
            json.dump({"imageLayoutVersion": "1.0.0"}, f)
        tmp = out + ".tmp"
        with tarfile.open(tmp, "w") as t:
            for entry in ["oci-layout", "index.json", "blobs"]:
                t.add(os.path.join(d, entry), arcname=entry)
        os.replace(tmp, out)

if __name__ == "__main__":
    main()
