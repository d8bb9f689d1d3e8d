"""org.varlink.service, answered with our own IDL renderer.

asyncvarlink's GetInterfaceDescription renders without field comments; ours
renders the same text as interfaces/*.varlink, so `varlinkctl introspect`
shows every field's documentation.
"""

from asyncvarlink import varlinkmethod
from asyncvarlink.serviceinterface import InterfaceNotFound, VarlinkServiceInterface


class ServiceInterface(VarlinkServiceInterface):
    _descriptions: dict[str, str]

    @varlinkmethod(return_parameter="description")
    def GetInterfaceDescription(self, *, interface: str) -> str:
        """Get the description of an interface that is implemented by this
        service.
        """
        # Rendering takes milliseconds and the answer never changes while the
        # daemon runs: render each interface once.
        cache: dict[str, str] = self.__dict__.setdefault("_descriptions", {})
        if interface not in cache:
            try:
                found = self._registry[interface]
            except KeyError:
                raise InterfaceNotFound(interface=interface) from None
            cache[interface] = found.render_interface_description(comments=self._comments)
        return cache[interface]
