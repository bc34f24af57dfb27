"""What the tests share: real servers, trees, images and clients they run."""
