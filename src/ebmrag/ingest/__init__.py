"""Knowledge sources -> normalized, hashed `Document`s -> `Chunk`s with offsets for citations."""
