from oasr.decoding import GpuDecoderConfig, GpuStreamingDecoder
