from torchvision._stub import module_getattr

__getattr__ = module_getattr("torchvision.transforms")
__version__ = "0.0.0+stub"
