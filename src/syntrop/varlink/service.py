"""org.varlink.service, answered with our own IDL renderer.

asyncvarlink's GetInterfaceDescription renders without field comments; ours
renders the same text as interfaces/*.varlink, so `varlinkctl introspect`
shows every field's documentation.
"""

from asyncvarlink import varlinkmethod
from asyncvarlink.serviceinterface import InterfaceNotFound, VarlinkServiceInterface


class ServiceInterface(VarlinkServiceInterface):
    @varlinkmethod(return_parameter="description")
    def GetInterfaceDescription(self, *, interface: str) -> str:
        """Get the description of an interface that is implemented by this
        service.
        """
        try:
            found = self._registry[interface]
        except KeyError:
            raise InterfaceNotFound(interface=interface) from None
        return found.render_interface_description(comments=self._comments)
