"""The image's build and supply chain: image tags, the SBOM, and an image's
provenance read without running it."""
