// A Java producer with KIP-714 metrics push on (enable.metrics.push=true, the default made
// explicit): sends one record, prints "INSTANCE <client instance id>" once the broker's
// GetTelemetrySubscriptions answer gave it one, keeps running <linger ms> so pushes happen at
// the subscription's interval, then closes (close sends a terminating push). Exit 0 on success.
// Usage: TelemetryClient <bootstrap> <topic> <linger ms>
import java.time.Duration;
import java.util.Properties;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.serialization.StringSerializer;

public class TelemetryClient {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("enable.metrics.push", "true");
        props.put("client.id", "kip714-client");
        props.put("key.serializer", StringSerializer.class.getName());
        props.put("value.serializer", StringSerializer.class.getName());
        long linger = Long.parseLong(args[2]);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            producer.send(new ProducerRecord<>(args[1], "k", "telemetry")).get();
            Uuid id = producer.clientInstanceId(Duration.ofSeconds(30));
            System.out.println("INSTANCE " + id);
            System.out.flush();
            Thread.sleep(linger);
        }
        System.out.println("CLOSED");
    }
}
