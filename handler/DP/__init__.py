"""DataParallel: one process drives every visible GPU, splitting each batch among them."""
