"""tei_corpus: the offline corpus job (`tei-embed`) on Ray Data, a tool over `tei_runtime`."""
