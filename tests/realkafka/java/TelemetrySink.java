// A broker-side KIP-714 receiver for the real-Kafka tier: a MetricsReporter implementing
// ClientTelemetry, so the broker advertises GetTelemetrySubscriptions (71) / PushTelemetry (72)
// (a stock 4.1 broker without one answers them UNSUPPORTED in ApiVersions, and clients never
// push). Every push it receives is appended as one line to the file named by the broker
// property pidgate.telemetry.sink.file:
//   <client instance id> <terminating> <content type> <bytes> <metric count> <principal>
// (metric count: the OTLP MetricsData's metrics, -1 when the payload does not parse).
import io.opentelemetry.proto.metrics.v1.MetricsData;
import io.opentelemetry.proto.metrics.v1.ResourceMetrics;
import io.opentelemetry.proto.metrics.v1.ScopeMetrics;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.List;
import java.util.Map;
import org.apache.kafka.common.metrics.KafkaMetric;
import org.apache.kafka.common.metrics.MetricsReporter;
import org.apache.kafka.server.telemetry.ClientTelemetry;
import org.apache.kafka.server.telemetry.ClientTelemetryReceiver;

public class TelemetrySink implements MetricsReporter, ClientTelemetry {
    private volatile Path file;

    @Override
    public void configure(Map<String, ?> configs) {
        Object name = configs.get("pidgate.telemetry.sink.file");
        file = name == null ? null : Paths.get(name.toString());
    }

    @Override public void init(List<KafkaMetric> metrics) {}
    @Override public void metricChange(KafkaMetric metric) {}
    @Override public void metricRemoval(KafkaMetric metric) {}
    @Override public void close() {}

    @Override
    public ClientTelemetryReceiver clientReceiver() {
        return (context, payload) -> {
            ByteBuffer data = payload.data().duplicate();
            byte[] bytes = new byte[data.remaining()];
            data.get(bytes);
            int metrics;
            try {
                metrics = 0;
                for (ResourceMetrics resource : MetricsData.parseFrom(bytes).getResourceMetricsList()) {
                    for (ScopeMetrics scope : resource.getScopeMetricsList()) {
                        metrics += scope.getMetricsCount();
                    }
                }
            } catch (Exception e) {
                metrics = -1;
            }
            String line = payload.clientInstanceId() + " " + payload.isTerminating() + " "
                + payload.contentType() + " " + bytes.length + " " + metrics + " "
                + context.principal() + "\n";
            Path target = file;
            if (target == null) return;
            synchronized (TelemetrySink.class) {
                try {
                    Files.write(target, line.getBytes(StandardCharsets.UTF_8),
                        StandardOpenOption.CREATE, StandardOpenOption.APPEND);
                } catch (IOException e) {
                    throw new RuntimeException(e);
                }
            }
        };
    }
}
